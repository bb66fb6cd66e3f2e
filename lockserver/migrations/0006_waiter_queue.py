"""lock_waiter as a queue (ARCHITECTURE decision 23): arrival order and the grant's TTL."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("lockserver", "0005_grant_waiter_until")]

    operations = [
        migrations.AddField("lockwaiter", "position", models.BigIntegerField(null=True)),
        migrations.AddField("lockwaiter", "ttl_ms", models.IntegerField(null=True)),
        migrations.AddIndex(
            "lockwaiter",
            models.Index(fields=["lock_key", "position"], name="lock_waiter_queue"),
        ),
        migrations.RunSQL(
            sql=(
                "CREATE SEQUENCE lock_waiter_position_seq AS bigint;"
                " ALTER TABLE lock_waiter ALTER COLUMN position"
                " SET DEFAULT nextval('lock_waiter_position_seq')"
            ),
            reverse_sql=(
                "ALTER TABLE lock_waiter ALTER COLUMN position DROP DEFAULT;"
                " DROP SEQUENCE lock_waiter_position_seq"
            ),
        ),
    ]
