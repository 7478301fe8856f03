import pytest

from executions.spec import ExecutionSpec, SpecError

pytestmark = pytest.mark.django_db


def test_digest_is_stable_and_ignores_env_order():
    one = ExecutionSpec.build(["sh", "-c", "true"], env={"A": "1", "B": "2"})
    two = ExecutionSpec.build(["sh", "-c", "true"], env={"B": "2", "A": "1"})
    assert one.digest == two.digest
    assert ExecutionSpec.from_json(one.to_json()).digest == one.digest


def test_digest_changes_with_any_field():
    base = ExecutionSpec.build(["sh"])
    assert ExecutionSpec.build(["sh"], cols=100).digest != base.digest
    assert ExecutionSpec.build(["sh"], cwd="/tmp").digest != base.digest
    assert ExecutionSpec.build(["bash"]).digest != base.digest


@pytest.mark.parametrize(
    ("argv", "options", "message"),
    [
        ([], {}, "argv"),
        (["sh", "\x00"], {}, "NUL"),
        (["sh"], {"cols": 0}, "cols"),
        (["sh"], {"cols": 501}, "cols"),
        (["sh"], {"rows": 201}, "rows"),
        (["sh"], {"env": {"A=B": "x"}}, "env"),
        (["sh"], {"idle_seconds": -1}, "idle_seconds"),
    ],
)
def test_bad_specs_are_refused_with_the_field_named(argv, options, message):
    with pytest.raises(SpecError, match=message):
        ExecutionSpec.build(argv, **options)
