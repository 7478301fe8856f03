"""Leases say when the session holder of their process is known to be gone (recovery sweeps the others)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("terminals", "0015_recording_chunks_in_storage")]

    operations = [
        migrations.AddField(
            model_name="processlease",
            name="holder_ended_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        # Leases released before: their holders are not looked for again.
        migrations.RunSQL(
            "UPDATE terminals_processlease SET holder_ended_at = released_at WHERE released_at IS NOT NULL",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
