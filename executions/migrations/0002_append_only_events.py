"""On PostgreSQL, refuse UPDATE and DELETE on the audit tables at the database itself."""

from django.db import migrations

TABLES = ["executions_executionevent", "executions_machineevent"]

CREATE_FUNCTION = """
CREATE OR REPLACE FUNCTION tether_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'table % is append-only', TG_TABLE_NAME;
END;
$$ LANGUAGE plpgsql;
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(CREATE_FUNCTION, None)  # None: the body has a literal %
    for table in TABLES:
        schema_editor.execute(
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION tether_append_only()"
        )


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in TABLES:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
    schema_editor.execute("DROP FUNCTION IF EXISTS tether_append_only()")


class Migration(migrations.Migration):
    dependencies = [("executions", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
