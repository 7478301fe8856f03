"""Recording chunks are compressed with lz4, not PostgreSQL's default pglz.

pglz spent about 20 ms of PostgreSQL's CPU on each MB of a busy shell's event lines (JSON of the output) and
lz4 about 6 ms (docs/benchmarks.md): with pglz, storing a recording took more CPU than the whole path the
output streams through. Chunks live only until the recording becomes a file, so lz4's lighter compression
costs little room. On a PostgreSQL built without lz4 (or before 14) the column is left as it is.
"""

from django.db import migrations, transaction


def _set_compression(method: str):
    def run(apps, schema_editor):
        connection = schema_editor.connection
        if connection.vendor != "postgresql" or connection.pg_version < 140000:
            return
        table = schema_editor.quote_name(apps.get_model("terminals", "RecordingChunk")._meta.db_table)
        try:
            with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                cursor.execute(f"ALTER TABLE {table} ALTER COLUMN data SET COMPRESSION {method}")
        except Exception:  # built without lz4: "compression method lz4 not supported"
            if method == "lz4":
                return
            raise

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("terminals", "0013_heartbeat_per_worker"),
    ]

    operations = [migrations.RunPython(_set_compression("lz4"), _set_compression("pglz"))]
