import subprocess
import sys
import textwrap

from bat_gym.envs.medbench_lite import MedBenchLite, benchmark
from bat_gym.envs.medbench_lite.spec import SPEC

from .conftest import TRACKS


def test_spec_stages_tracks_and_splits():
    assert isinstance(benchmark(), MedBenchLite) and benchmark().spec is SPEC
    assert SPEC.name == "medbench_lite" and SPEC.default_priority == 100
    assert [s.id for s in SPEC.stages] == ["S1", "S2", "S3", "S4", "S5"]
    assert [s.weight for s in SPEC.stages] == [0.25, 0.15, 0.35, 0.15, 0.10]
    assert SPEC.stage("S3").artifacts == ("validation/pilot.csv", "validation/s3_validation.json")
    assert "setup/model_load.json" in SPEC.stage("S2").artifacts
    assert tuple(t.name for t in SPEC.tracks) == TRACKS
    assert SPEC.splits.heldout_repeats == 10
    assert not SPEC.splits.train.overlaps(SPEC.splits.heldout)


def test_stage_skills_are_public_and_name_no_track_answer():
    leaks = (
        "RAS",
        "MONOCHROME1",
        "radiological",
        "row, col",
        "to_unit",
        "normalize(",
        "spacing=",
        "4095",
    )
    for stage in SPEC.stages:
        assert len(stage.skill) > 200
        assert not [w for w in leaks if w in stage.skill], stage.id


def test_generation_is_byte_identical_across_processes(bench, tmp_path):
    code = textwrap.dedent(
        """
        import sys, tempfile, pathlib
        from bat_gym.envs.medbench_lite import MedBenchLite
        from bat_gym.core.sandbox import WorkspaceIndex
        b = MedBenchLite()
        for name in sys.argv[1:]:
            d = pathlib.Path(tempfile.mkdtemp())
            b.write_public_files(b.make_task(name, 42, "train"), d)
            print(WorkspaceIndex(d).scan().digest)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *TRACKS],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "7", "PATH": "/usr/bin:/bin"},
    ).stdout.split()
    from bat_gym.core.sandbox import WorkspaceIndex

    here = []
    for name in TRACKS:
        d = tmp_path / name
        d.mkdir()
        bench.write_public_files(bench.make_task(name, 42, "train"), d)
        here.append(WorkspaceIndex(d).scan().digest)
    assert out == here


def test_the_declared_teacher_stages_are_the_scripts_for_every_track_and_outcome(bench):
    """teacher_stages lets the default states plan without generating a task: it must
    name exactly the stages of the script the task's teacher plays, and task_id the id."""
    for track in bench.spec.tracks:
        seed = bench.seeds("train")[0]
        task = bench.task_of(track.name, seed, "train")
        assert task.task_id == bench.task_id(track.name, seed, "train")
        for outcome in bench.outcomes:
            script = tuple(t.stage for t in bench.teacher_script(task, outcome))
            assert bench.teacher_stages(track.name, outcome) == script, (track.name, outcome)
