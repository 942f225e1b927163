"""The LeRobot policy benchmark refuses to start without the policies it measures (its smoke run, in LeRobot's venv, is
tests/policies/test_lerobot_venv.py's)."""

from benchmarks.lerobot_policy import main


def test_bench_lerobot_policy_asks_for_the_policies_it_measures(capsys):
    assert main([]) == 2
    assert "--policies" in capsys.readouterr().err
