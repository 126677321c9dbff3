"""A stateful, model-based test of the writer's whole output folder (hypothesis
``RuleBasedStateMachine``): runs, restarts with other ``maxcount``/``maxsize``, runs killed
(SIGKILL, a real process) before a shard's rename, after it, or half-way through a progress
line, inputs that shrink, grow or change, a lost progress record, and a user's file named
like a shard (never removed nor written over: every run is refused while it is there).

After every step the folder's shards, read by ``tarfile`` and by webdataset, hold exactly what
a small model says, or the step was refused with the error the model expects. The model is
obviously correct by construction: a plan is the input cut where the next sample would pass
``maxcount`` samples or ``maxsize`` tar bytes (each member a 512-byte header and its data
padded to 512, two end blocks), and the folder is a dict from shard number to samples.
"""

from __future__ import annotations

import os
import signal
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.writing.gnu_tar import check_with_gnu_tar
from wds_datapipes.writing import progress as progress_module
from wds_datapipes.writing import write_shards

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the kills fork the run (POSIX)")

Sample = tuple[str, tuple[tuple[str, bytes], ...]]  # (key, ((field, bytes), ...))
SETTINGS = st.sampled_from([(3, None), (5, None), (8, None), (None, 4096), (4, 6144), (None, 20000)])
CRASH = st.one_of(st.none(), st.tuples(st.sampled_from(["before_rename", "after_rename", "mid_record"]),
                                       st.integers(1, 5)))


def _padded(size: int) -> int:
    return 512 + -(-size // 512) * 512


def plan(samples: list[Sample], maxcount: int | None, maxsize: int | None) -> list[list[Sample]]:
    """The model's plan: a new shard where one more sample would pass maxcount or maxsize."""
    shards: list[list[Sample]] = []
    size = 0
    for sample in samples:
        cost = sum(_padded(len(data)) for _, data in sample[1])
        if not shards or (maxcount is not None and len(shards[-1]) >= maxcount) or \
                (maxsize is not None and size + cost > maxsize):
            shards.append([])
            size = 1024
        shards[-1].append(sample)
        size += cost
    return shards


def _facts(shard: list[Sample]) -> list:
    return [(key, [(name, len(data)) for name, data in fields]) for key, fields in shard]


def _run_in_child(out: Path, samples: list[Sample], maxcount, maxsize, restart: bool, crash) -> tuple[str, str]:
    """One run in a forked process, SIGKILLed at the crash point; ("done" | "refused" | "killed", message)."""
    message = out.parent / "message.txt"
    message.unlink(missing_ok=True)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            if crash is not None:
                _arm(*crash)
            write_shards(({"__key__": k, **dict(f)} for k, f in samples), str(out / "s-%04d.tar"),
                         maxcount=maxcount, maxsize=maxsize, restart=restart, fsync=False)
            code = 0
        except Exception as exn:  # noqa: BLE001 - the message goes to the parent
            message.write_text(f"{type(exn).__name__}: {exn}")
            code = 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError("a run did not end in 60 s")
        time.sleep(0.002)
    if os.WIFSIGNALED(status):
        return "killed", ""
    text = message.read_text() if message.exists() else ""
    return {0: "done", 2: "refused"}.get(os.WEXITSTATUS(status), "failed"), text


def _arm(kind: str, nth: int) -> None:
    """In the child: SIGKILL at the nth shard rename (before or after it) or half-way through the nth record line."""
    count = [0]
    if kind in ("before_rename", "after_rename"):
        replace = os.replace

        def replacing(src, dst, *args, **kwargs):
            shard = str(src).endswith(".tar.part")
            count[0] += shard
            if shard and kind == "before_rename" and count[0] == nth:
                os.kill(os.getpid(), signal.SIGKILL)
            replace(src, dst, *args, **kwargs)
            if shard and kind == "after_rename" and count[0] == nth:
                os.kill(os.getpid(), signal.SIGKILL)

        os.replace = replacing
    else:
        original = progress_module.ProgressLog._append

        def append(self, entry):
            count[0] += 1
            if count[0] == nth:
                line = entry + "\n"  # the line's text
                self._out.write(line[: len(line) // 2])
                self._out.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            original(self, entry)

        progress_module.ProgressLog._append = append


class WriterModel(RuleBasedStateMachine):
    """The folder (shard number -> samples), the progress record (settings, recorded shards,
    the end's count) and the input, against the writer run in a child process."""

    def __init__(self):
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="wds-model-"))
        self.out = self.root / "out"
        self.disk: dict[int, list[Sample]] = {}
        self.record: dict | None = None  # {"settings": (maxcount, maxsize), "shards": {n: facts}, "end": int | None}
        self.input: list[Sample] = []
        self.serial = 0
        self.setting = (5, None)  # the settings of a resume where no record says them
        self.foreign: dict[int, bytes] = {}  # a user's files named like shards, by number

    @initialize(count=st.integers(4, 26), seed=st.integers(0, 2**16))
    def start(self, count, seed):
        rng = __import__("random").Random(seed)
        self.rng = rng
        self.input = [self._sample(i) for i in range(count)]

    def _sample(self, i: int, tag: str = "") -> Sample:
        rng = self.rng
        return (f"k{i:03d}{tag}", (("bin", rng.randbytes(rng.randrange(0, 1600))), ("txt", f"t{i}{tag}".encode())))

    # ------------------------------------------------------------ the input

    @rule(keep=st.integers(1, 25))
    def shrink(self, keep):
        self.input = self.input[: max(1, min(keep, len(self.input) - 1))]

    @rule(drop=st.integers(1, 3), crash=CRASH)
    def drop_last_shards_and_resume(self, drop, crash):
        """The input cut where a shard of the last plan ends (the shards after it lose all their
        samples), then a resume."""
        setting = self.record["settings"] if self.record else self.setting
        shards = plan(self.input, *setting)
        if len(shards) > drop:
            self.input = self.input[: sum(len(shard) for shard in shards[:-drop])]
        self._step(setting, crash, restart=False)

    @rule(more=st.integers(1, 8))
    def grow(self, more):
        start = len(self.input)
        self.input = self.input + [self._sample(start + i, "g") for i in range(more)]

    @rule(at=st.integers(0, 30), how=st.sampled_from(["size", "key", "field"]))
    def change(self, at, how):
        at %= len(self.input)
        key, fields = self.input[at]
        self.serial += 1
        if how == "size":
            fields = (("bin", fields[0][1] + b"+" * (1 + self.serial % 700)), fields[1])
        elif how == "key":
            key = f"{key}c{self.serial}"
        else:
            # one "extra" field, replaced by another of a new size (never a second field of that name)
            fields = (*(f for f in fields if f[0] != "extra"), ("extra", b"x" * (1 + self.serial % 50)))
        self.input[at] = (key, fields)

    @rule(n=st.sampled_from([2, 600]))
    def plant_a_users_file(self, n):
        """A user's file named like shard ``n`` (within a plan, or past any), where no shard is."""
        if n not in self.disk:
            self.out.mkdir(parents=True, exist_ok=True)
            self.foreign[n] = f"a user's file {n}".encode()
            (self.out / f"s-{n:04d}.tar").write_bytes(self.foreign[n])

    @rule()
    def move_the_users_files_away(self):
        for n in self.foreign:
            (self.out / f"s-{n:04d}.tar").unlink()
        self.foreign.clear()

    @rule()
    def lose_record(self):
        path = self.out / "index.json.rank0-of-1.progress"
        if path.exists():
            path.unlink()
        self.record = None

    # ------------------------------------------------------------ runs

    @rule(setting=SETTINGS, crash=CRASH)
    def run(self, setting, crash):
        self._step(setting, crash, restart=False)

    @rule(crash=CRASH)
    def resume(self, crash):
        self._step(self.record["settings"] if self.record else self.setting, crash, restart=False)

    @rule()
    def resume_to_the_end(self):
        self._step(self.record["settings"] if self.record else self.setting, None, restart=False)

    @rule(setting=SETTINGS, crash=CRASH)
    def restart(self, setting, crash):
        self._step(setting, crash, restart=True)

    def _step(self, setting, crash, restart: bool) -> None:
        self.setting = setting
        outcome, message = _run_in_child(self.out, self.input, *setting, restart, crash)
        expected, words = self._predict(setting, crash, restart)
        event(f"{'restart' if restart else 'run'}: {expected} {words}".strip())
        assert outcome == expected, (outcome, expected, message)
        if words:
            assert words in message, (words, message)
        if outcome == "done":
            assert (self.out / "index.json").exists()
            check_with_gnu_tar(sorted(p for p in self.out.glob("*.tar") if int(p.stem[2:]) not in self.foreign))

    def _predict(self, setting, crash, restart: bool) -> tuple[str, str]:
        """Plays the run on the model (the same order of events as a one-process run); the
        outcome expected and words its message must hold."""
        events = [0]
        kind, nth = crash if crash is not None else (None, 0)

        def crashes(what: str) -> bool:
            """Whether the crash happens at this event."""
            if what == kind or (what == "rename" and kind in ("before_rename", "after_rename")):
                events[0] += 1
                return events[0] == nth
            return False

        foreign = "an earlier run of the writer left"  # a user's file: refused at once, before anything else
        if restart or self.record is None:
            if self.foreign:
                return "refused", foreign
            if not restart and self.disk:
                return "refused", "no progress record"
            self.disk.clear()
            self.record = {"settings": setting, "shards": {}, "end": None}
        elif self.record["settings"] != setting:
            return "refused", "other settings"
        elif self.foreign:
            return "refused", foreign
        shards = plan(self.input, *setting)
        recorded = self.record["shards"]
        for n, shard in enumerate(shards):
            if n in recorded:
                if recorded[n] != _facts(shard):
                    return "refused", "input changed"
                continue
            if crashes("rename"):
                if kind == "after_rename":
                    self.disk[n] = shard
                return "killed", ""
            self.disk[n] = shard
            if crashes("mid_record"):
                return "killed", ""
            recorded[n] = _facts(shard)
        if any(n >= len(shards) for n in [*recorded, *self.disk]) or (self.record["end"] or 0) > len(shards):
            return "refused", "shrank or changed"
        if crashes("mid_record"):  # the end line cut half-way
            return "killed", ""
        self.record["end"] = len(shards)
        return "done", ""

    # ------------------------------------------------------------ the folder

    @invariant()
    def folder_holds_what_the_model_says(self):
        if not self.out.exists():
            assert not self.disk
            return
        for n, data in self.foreign.items():
            assert (self.out / f"s-{n:04d}.tar").read_bytes() == data
        paths = sorted(p for p in self.out.glob("*.tar") if int(p.stem[2:]) not in self.foreign)
        assert [p.name for p in paths] == [f"s-{n:04d}.tar" for n in sorted(self.disk)]
        want = [s for n in sorted(self.disk) for s in self.disk[n]]
        got: list[Sample] = []
        for path in paths:  # oracle: tarfile
            with tarfile.open(path) as tar:
                for member in tar:
                    key, _, field = member.name.partition(".")
                    if not got or got[-1][0] != key:
                        got.append((key, ()))
                    got[-1] = (key, (*got[-1][1], (field, tar.extractfile(member).read())))
        assert got == want
        if paths:  # oracle: webdataset 1.0.2
            import webdataset as wds

            read = [(s["__key__"], tuple((f, s[f]) for f, _ in fields))
                    for s, (_, fields) in zip(wds.WebDataset([str(p) for p in paths], shardshuffle=False,
                                                              empty_check=False), want)]
            assert read == want

    def teardown(self):
        import shutil

        shutil.rmtree(self.root, ignore_errors=True)


@pytest.mark.timeout(300)
def test_the_writer_s_folder_follows_the_model_through_runs_kills_restarts_and_changed_inputs():
    """oracles: the model (module docstring), tarfile, webdataset 1.0.2, GNU tar after each completed run."""
    with tempfile.TemporaryDirectory() as warm:  # what a run imports lazily, imported once here, not in every child
        write_shards([{"__key__": "a", "bin": b"x"}], os.path.join(warm, "s-%d.tar"), fsync=False)
    run = settings(max_examples=int(os.environ.get("WDS_MODEL_EXAMPLES", "20")), stateful_step_count=10,
                   deadline=None, database=None, suppress_health_check=list(HealthCheck))
    WriterModel.TestCase.settings = run
    WriterModel.TestCase().runTest()
