"""A POSIX shell's history as its last end mark said it, for the session's next owner."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("terminals", "0016_lease_holder_ended")]

    operations = [
        migrations.AddField(
            model_name="terminalsession",
            name="marks_history",
            field=models.JSONField(blank=True, default=dict, editable=False),
        ),
    ]
