"""On PostgreSQL, refuse an UPDATE that changes what an execution is: its identity, kind, machine and spec.

The spec's digest is what idempotent submission compares, so a spec rewritten in place would make a
re-submission of the old spec a conflict and the record a lie about what ran. No code path updates
these columns; the trigger makes a raw ``.update()`` or SQL write fail too. Rewriting a column with
its own value (a full ``save()``) passes. SQLite (embedded mode) has no such trigger, as in 0002.
"""

from django.db import migrations

TABLE = "executions_execution"
FIXED_COLUMNS = ["scope", "execution_id", "kind", "machine_id", "spec", "spec_digest"]


def _function() -> str:
    checks = "\n".join(
        f"    IF NEW.{column} IS DISTINCT FROM OLD.{column} THEN\n"
        f"        RAISE EXCEPTION 'execution %: {column} is immutable', OLD.id\n"
        "            USING ERRCODE = 'integrity_constraint_violation';\n"
        "    END IF;"
        for column in FIXED_COLUMNS
    )
    return (
        "CREATE OR REPLACE FUNCTION tether_execution_fixed() RETURNS trigger AS $$\n"
        f"BEGIN\n{checks}\n    RETURN NEW;\nEND;\n$$ LANGUAGE plpgsql;"
    )


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(_function(), None)  # None: the body has a literal %
    schema_editor.execute(
        f"CREATE TRIGGER {TABLE}_fixed BEFORE UPDATE ON {TABLE} FOR EACH ROW EXECUTE FUNCTION tether_execution_fixed()"
    )


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_fixed ON {TABLE}")
    schema_editor.execute("DROP FUNCTION IF EXISTS tether_execution_fixed()")


class Migration(migrations.Migration):
    dependencies = [("executions", "0005_one_live_execution_per_machine")]
    operations = [migrations.RunPython(forwards, backwards)]
