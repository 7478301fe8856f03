"""A recording's chunks are files in the recordings storage, each named by its row (``file``).

Kept in PostgreSQL, a busy shell's output was written twice over (the TOAST rows and the WAL: 1.1 MB of WAL
per MB) and cost PostgreSQL 7-9 ms of CPU per MB, a third of the whole path's (docs/benchmarks.md). Rows written
before this keep their events in ``data`` and still make their recording's file. A file's row leaves ``data``
NULL: an older release still running during an upgrade fails on it (and tries again later) rather than make a
recording without it.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("terminals", "0014_recording_chunks_lz4"),
    ]

    operations = [
        migrations.AddField(
            model_name="recordingchunk",
            name="file",
            # The database's own default: an older release, still running during an upgrade, writes chunks
            # without this column (in ``data``), and those rows still make their file.
            field=models.CharField(blank=True, db_default="", default="", max_length=255),
        ),
        migrations.AlterField(
            model_name="recordingchunk",
            name="data",
            field=models.BinaryField(blank=True, null=True),
        ),
    ]
