from django.db import migrations


def create_default_config(apps, schema_editor):
    config = apps.get_model("railstub", "RailstubConfig")
    config.objects.using(schema_editor.connection.alias).get_or_create(id=1)


class Migration(migrations.Migration):
    dependencies = [("railstub", "0001_initial")]

    operations = [migrations.RunPython(create_default_config, migrations.RunPython.noop)]
