"""Executions say whether their output was seen to its end (a crashed owner's is not)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("executions", "0011_identity_namespaces")]

    operations = [
        migrations.AddField(
            model_name="execution",
            name="output_complete",
            field=models.BooleanField(
                default=False, help_text="The output was seen to its end (false: a worker was lost while it ran)."
            ),
        ),
        # Earlier records: complete unless their outcome was never observed (unknown, resolved after it).
        migrations.RunSQL(
            "UPDATE executions_execution SET output_complete = state NOT IN ('unknown', 'resolved')",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
