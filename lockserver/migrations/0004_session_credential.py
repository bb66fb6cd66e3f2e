"""The credential that opened each session (lockserver.ownership)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("lockserver", "0003_token_high_water")]

    operations = [
        migrations.RunSQL(
            sql=(
                "CREATE TABLE lock_session_credential ("
                " session_id uuid PRIMARY KEY,"
                " credential_id text NOT NULL,"
                " created_at timestamptz NOT NULL DEFAULT clock_timestamp())"
            ),
            reverse_sql="DROP TABLE lock_session_credential",
        )
    ]
