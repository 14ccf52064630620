"""benchmarks/ten_minutes.py's time ratio: when a run reaches another's last periodic dev BLEU."""
import importlib.util
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def ten_minutes():
    path = os.path.join(HERE, "..", "benchmarks", "ten_minutes.py")
    spec = importlib.util.spec_from_file_location("ten_minutes_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(points):
    """A record's curve: [(training seconds, step, dev BLEU, chrF, dev loss)]."""
    return {"curve": [[s, i * 100, b, None, 1.0] for i, (s, b) in enumerate(points, 1)]}


def test_sooner_is_the_first_runs_seconds_over_when_the_other_reached_its_last_bleu(ten_minutes):
    first = run([(100, 10.0), (300, 18.0), (600, 20.0)])
    other = run([(100, 12.0), (300, 19.0), (500, 21.0), (600, 22.0)])
    when, ratio = ten_minutes.sooner(first, other)
    assert when == pytest.approx(400.0)          # 19 at 300 s, 21 at 500 s: 20 at 400 s
    assert ratio == pytest.approx(1.5)


def test_a_run_that_never_reaches_it_has_no_ratio(ten_minutes):
    assert ten_minutes.sooner(run([(600, 20.0)]), run([(300, 10.0), (600, 19.9)])) == (None, None)


def test_a_first_run_without_a_scored_evaluation_has_no_target(ten_minutes):
    assert ten_minutes.sooner(run([(600, None)]), run([(300, 30.0)])) == (None, None)


@pytest.mark.parametrize("names", [["base"], ["base", "base"], ["base", "baseline"], ["base", ""]])
def test_variants_that_would_share_runs_are_refused(ten_minutes, names):
    with pytest.raises(SystemExit, match="--variant"):
        ten_minutes.check_variants([(n, "/tmp") for n in names])


def test_distinct_variants_pass(ten_minutes):
    ten_minutes.check_variants([("baseline", "/a"), ("new", "/b")])
