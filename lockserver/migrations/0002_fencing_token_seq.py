"""The one global token source of the PostgreSQL backend (C3 §3.3: NEXTVAL of fencing_token_seq).

NO CYCLE: a wrapped sequence would hand out a token below every fence already stored.
The LOCK_TOKEN_FLOOR setting is applied at start-up (lockserver.backends.token_sql.apply_token_floor).
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("lockserver", "0001_initial")]

    operations = [
        migrations.RunSQL(
            sql="CREATE SEQUENCE fencing_token_seq AS bigint START WITH 1 MINVALUE 1 NO CYCLE",
            reverse_sql="DROP SEQUENCE fencing_token_seq",
        )
    ]
