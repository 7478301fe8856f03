"""On PostgreSQL, grant events are append-only at the database too (function from executions 0002)."""

from django.db import migrations

TABLE = "access_grantevent"


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE TRIGGER {TABLE}_append_only BEFORE UPDATE OR DELETE ON {TABLE} "
            "FOR EACH ROW EXECUTE FUNCTION tether_append_only()"
        )


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_append_only ON {TABLE}")


class Migration(migrations.Migration):
    dependencies = [("access", "0001_grants"), ("executions", "0002_append_only_events")]
    operations = [migrations.RunPython(forwards, backwards)]
