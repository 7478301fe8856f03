"""Identities belong to their owner: an execution's (scope, id) lives in a namespace, its submitter's for what
was submitted through the API ("user:PK"), so two people may use the same (scope, id) without meeting.

Existing rows keep every identity: a command a user submitted (the API is the only way a user submits one)
moves into that user's namespace, so its retry after the upgrade still finds it; the command line's and the
shells' stay in the shared one (""). On PostgreSQL the namespace is as immutable as the rest of the identity
(the trigger of 0006, with the column added)."""

from django.conf import settings
from django.db import migrations, models

FIXED_COLUMNS = ["namespace", "scope", "execution_id", "kind", "machine_id", "spec", "spec_digest"]


def into_owners_namespaces(apps, schema_editor):
    Execution = apps.get_model("executions", "Execution")
    for pk, user in Execution.objects.filter(kind="command", requested_by__isnull=False).values_list(
        "pk", "requested_by"
    ):
        Execution.objects.filter(pk=pk).update(namespace=f"user:{user}")


def _function(columns) -> str:
    checks = "\n".join(
        f"    IF NEW.{column} IS DISTINCT FROM OLD.{column} THEN\n"
        f"        RAISE EXCEPTION 'execution %: {column} is immutable', OLD.id\n"
        "            USING ERRCODE = 'integrity_constraint_violation';\n"
        "    END IF;"
        for column in columns
    )
    return (
        "CREATE OR REPLACE FUNCTION tether_execution_fixed() RETURNS trigger AS $$\n"
        f"BEGIN\n{checks}\n    RETURN NEW;\nEND;\n$$ LANGUAGE plpgsql;"
    )


def namespace_fixed(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_function(FIXED_COLUMNS), None)  # None: the body has a literal %


def namespace_free(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_function(FIXED_COLUMNS[1:]), None)


class Migration(migrations.Migration):
    dependencies = [
        ("executions", "0010_machine_labels"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="execution", name="execution_identity_unique"),
        migrations.AddField(
            model_name="execution", name="namespace", field=models.CharField(blank=True, default="", max_length=64)
        ),
        migrations.RunPython(into_owners_namespaces, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="execution",
            constraint=models.UniqueConstraint(
                fields=("namespace", "scope", "execution_id"), name="execution_identity_unique"
            ),
        ),
        migrations.RunPython(namespace_fixed, namespace_free),
    ]
