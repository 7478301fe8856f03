"""The content types of the moved models follow them, so the permissions given on them (revoke another user's
share link, view recordings) and the admin's history stay with the people they were given to.

When the new app's content types exist already (``migrate recordings 0001`` run by itself makes them at its
end), the grants on the old permissions are given on the new ones of the same codename, and the old types go."""

from django.conf import settings
from django.db import migrations

MODELS = ("recording", "recordingchunk", "sharelink")


def move(apps, schema_editor, source="terminals", target="recordings"):
    content_types = apps.get_model("contenttypes", "ContentType").objects.using(schema_editor.connection.alias)
    permissions = apps.get_model("auth", "Permission").objects.using(schema_editor.connection.alias)
    for model in MODELS:
        old = content_types.filter(app_label=source, model=model).first()
        if old is None:
            continue
        new = content_types.filter(app_label=target, model=model).first()
        if new is None:
            old.app_label = target
            old.save(update_fields=["app_label"])
            continue
        for permission in permissions.filter(content_type=old):
            twin = permissions.filter(content_type=new, codename=permission.codename).first()
            if twin is None:
                permission.content_type = new
                permission.save(update_fields=["content_type"])
                continue
            twin.user_set.add(*permission.user_set.all())
            twin.group_set.add(*permission.group_set.all())
            permission.delete()
        old.delete()


def move_back(apps, schema_editor):
    move(apps, schema_editor, source="recordings", target="terminals")


class Migration(migrations.Migration):
    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("recordings", "0001_initial"),
    ]

    operations = [migrations.RunPython(move, move_back)]
