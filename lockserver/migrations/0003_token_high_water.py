"""The deployment's token high water (CHANGELOG row 42): one row, seeded from
pg's sequence so a deployment that already issued pg tokens starts with them counted."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("lockserver", "0002_fencing_token_seq")]

    operations = [
        migrations.CreateModel(
            name="LockTokenHighWater",
            fields=[
                ("id", models.PositiveSmallIntegerField(primary_key=True, serialize=False)),
                ("token", models.BigIntegerField()),
                ("backend", models.CharField(max_length=8)),
                ("updated_at", models.DateTimeField()),
            ],
            options={
                "db_table": "lock_token_high_water",
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(id=1), name="lock_token_high_water_one_row"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(token__gte=0),
                        name="lock_token_high_water_non_negative",
                    ),
                ],
            },
        ),
        migrations.RunSQL(
            sql="""
            INSERT INTO lock_token_high_water (id, token, backend, updated_at)
            SELECT 1, CASE WHEN is_called THEN last_value ELSE last_value - 1 END, 'pg', now()
            FROM fencing_token_seq
            """,
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
