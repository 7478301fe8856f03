import time
import pytest
from terminals import actions, recording_store
from tests.recordings.test_chunks import owned, taken, write  # noqa

pytestmark = pytest.mark.django_db

def test_time_write_chunk(owned):
    recording = owned[0]
    events = taken(b"x" * 1000, 1_001.0)
    import cProfile, pstats
    t = time.perf_counter(); c = time.process_time()
    
    for n in range(300):
        assert write(owned, n, events, "f")
    print(f"\nwrite_chunk: {(time.perf_counter()-t)/300*1e3:.3f} ms wall {(time.process_time()-c)/300*1e3:.3f} ms cpu")
    data = b"y" * 262144
    t = time.perf_counter(); c = time.process_time()
    for n in range(100):
        recording_store.save_chunk(recording.pk, n, data)
    print(f"save_chunk: {(time.perf_counter()-t)/100*1e3:.3f} ms wall {(time.process_time()-c)/100*1e3:.3f} ms cpu")


def test_time_select1():
    from django.db import connection
    from terminals.models import Recording
    with connection.cursor() as cur:
        t = time.perf_counter(); c = time.process_time()
        for n in range(1000):
            cur.execute("SELECT 1")
            cur.fetchone()
        print(f"\nselect1: {(time.perf_counter()-t)/1000*1e3:.3f} ms wall {(time.process_time()-c)/1000*1e3:.3f} ms cpu")
    t = time.perf_counter(); c = time.process_time()
    for n in range(300):
        Recording.objects.filter(pk=n, chunks=3).update(chunks=4)
    print(f"orm update: {(time.perf_counter()-t)/300*1e3:.3f} ms wall {(time.process_time()-c)/300*1e3:.3f} ms cpu")
