"""The content types of the moved models follow them, so the permissions given on them (revoke another user's
share link, view recordings) and the admin's history stay with the people they were given to."""

from django.db import migrations

MODELS = ("recording", "recordingchunk", "sharelink")


def move(apps, schema_editor, source="terminals", target="recordings"):
    content_types = apps.get_model("contenttypes", "ContentType")
    alias = schema_editor.connection.alias
    for model in MODELS:
        if not content_types.objects.using(alias).filter(app_label=target, model=model).exists():
            content_types.objects.using(alias).filter(app_label=source, model=model).update(app_label=target)


def move_back(apps, schema_editor):
    move(apps, schema_editor, source="recordings", target="terminals")


class Migration(migrations.Migration):
    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("recordings", "0001_initial"),
    ]

    operations = [migrations.RunPython(move, move_back)]
