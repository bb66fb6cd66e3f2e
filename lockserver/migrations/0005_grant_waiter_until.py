"""lock_grant.waiter_until: a freed key is NOTIFYed only while a waiter may be parked on it."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("lockserver", "0004_session_credential")]

    operations = [
        migrations.AddField(
            model_name="lockgrant",
            name="waiter_until",
            field=models.DateTimeField(null=True),
        )
    ]
