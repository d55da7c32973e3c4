"""CUDA kernel lists checked by sentinels, without a GPU: the profiler's known loss of each
session's first records (pytorch/pytorch#192021: the k-th session loses its first k; the very
first can lose all, pytorch/kineto#996) simulated over real cuBLAS kernel names."""

from __future__ import annotations

import random
import subprocess
import sys
import types

import kernel_names
import pytest

from matmul_drift.measure import kernels

SPIN = "spin_kernel"  # torch.cuda._sleep's kernel, as normalise_cuda gives "void spin_kernel(long)"
ADD = "at::native::vectorized_elementwise_kernel<4,at::native::CUDAFunctorOnSelf_add<unsigned char>>"  # a byte add
MARKS = (SPIN, ADD)
NAMES = [kernels.normalise_cuda(n) for tag, n in kernel_names.tagged() if tag == "full"]


class LossyProfiler:
    """Sessions as torch.profiler gives them: the spins, the call's kernels, the byte adds,
    less the first ``loss(session)`` records and the last ``tail_loss``."""

    tail_loss = 0

    def __init__(self, loss, truths):
        self.loss, self.truths, self.session, self.calls, self.current = loss, truths, 0, 0, 0

    def alone(self, pad: tuple[int, int]) -> list[str]:
        return self._lose([SPIN] * pad[0] + [ADD] * pad[1])

    def record(self, pad: tuple[int, int]) -> list[str]:
        self.calls += 1
        return self._lose([SPIN] * pad[0] + self.truths[self.current] + [ADD] * pad[1])

    def _lose(self, names: list[str]) -> list[str]:
        self.session += 1
        return names[self.loss(self.session):len(names) - self.tail_loss]


def grows(session: int) -> int:
    """#192021: everything in the first session, then one more record each session."""
    return 10**9 if session == 1 else session


def test_the_markers_are_kernels_no_matmul_launches():
    assert kernels.normalise_cuda("void spin_kernel(long)") == SPIN
    assert not any(SPIN in n or "unsigned char" in n for n in NAMES)


@pytest.mark.parametrize("names, want", [
    ([SPIN] * 4 + ["a", "b"] + [ADD] * 4, (["a", "b"], (0, 0))),
    ([SPIN] * 2 + ["a", "a"] + [ADD] * 4, (["a", "a"], (2, 0))),  # a kernel launched twice stays twice
    ([SPIN] + ["a"] + [ADD], (["a"], (3, 3))),  # the last records lost too: an add is left
    (["a"] + [ADD] * 4, (None, (4, 0))),  # every spin lost: "a" may not be the call's first kernel
    ([SPIN] * 4 + ["a"], (None, (0, 4))),  # no add: the call's last kernels may be missing
    ([SPIN] * 4 + [ADD] * 4, ([], (0, 0))),  # the call launched nothing (an empty product)
    ([SPIN] + [ADD], ([], (3, 3))),
    ([ADD] * 4, (None, (4, 0))),  # adds alone: the call's kernels may all be lost
    ([SPIN] * 3, (None, (1, 4))),  # spins alone: so may they, at the end
    ([], (None, (4, 4))),
])
def test_a_list_is_whole_only_between_a_surviving_spin_and_a_surviving_add(names, want):
    assert kernels.bracketed(names, MARKS, (4, 4)) == want


def test_kernel_lists_stay_whole_while_the_profiler_loses_more_each_session():
    rng = random.Random(5)
    truths = [[rng.choice(NAMES) for _ in range(rng.randint(0, 3))] for _ in range(300)]
    truths[7] = [NAMES[0], NAMES[0]]
    prof = LossyProfiler(grows, truths)
    s = kernels.Sentinels(prof.alone)
    assert s.marks == MARKS
    for prof.current, truth in enumerate(truths):
        assert s.kernels(prof.record) == truth
    # one try a call, while the loss rose past 300 records a session; the padding kept ahead
    assert prof.calls == 300 and prof.session == 302 and 302 < s.pad[0] < 2 * 302 + 8 and s.pad[1] == 4
    # the note: nothing traced again, and the padding after a head loss of 302 (the last session's)
    assert s.report() == ("the profiler lost kernel records; of 300 traced calls, 0 were traced again with more "
                          f"markers and 0 given up; markers now {2 * 302 + 4} before a call and 4 after it")
    # the same sessions without sentinels: the old lists read "(no kernel)"
    bare = LossyProfiler(grows, truths)
    bare.current = 7
    assert [bare.record((0, 0)) for _ in range(3)] == [[], [], []]


def test_a_profiler_that_loses_the_last_records_too_gives_whole_lists():
    """Losing the last records as well, 3 a session and now and then 9: every list is whole,
    the adds after the call grow to cover the end's loss, and the spins follow the head's loss
    alone (they grew without end when every failed try counted as a loss of all of them)."""
    truths = [[NAMES[i % len(NAMES)], NAMES[0]] for i in range(200)] + [[]]
    prof = LossyProfiler(lambda k: k % 3, truths)
    s = kernels.Sentinels(prof.alone)
    for prof.current, truth in enumerate(truths):
        prof.tail_loss = 3 if prof.current % 10 else 9
        assert s.kernels(prof.record) == truth
    # the first call's loss of 9 took everything, read as the whole padding lost on both sides
    assert s.pad == (2 * 4 + 4, 2 * 9 + 4) and prof.calls < len(truths) + 4
    retried = prof.calls - len(truths)  # each call that failed once took one more try: a loss of 9 fits in 22
    assert retried > 0 and s.report() == (f"the profiler lost kernel records; of {len(truths)} traced calls, "
                                          f"{retried} were traced again with more markers and 0 given up; markers "
                                          "now 12 before a call and 22 after it")


def test_a_profiler_that_loses_nothing_leaves_no_note(monkeypatch, capsys):
    prof = LossyProfiler(lambda k: 0, [[NAMES[0]]])
    s = kernels.Sentinels(prof.alone)
    assert s.kernels(prof.record) == [NAMES[0]] and s.report() is None
    monkeypatch.setattr(kernels, "_SENTINELS", [s])
    kernels._report_at_exit()
    assert capsys.readouterr().err == ""


def test_a_profiler_that_loses_every_try_is_one_clear_error(monkeypatch, tmp_path, capsys):
    prof = LossyProfiler(lambda k: 0 if k == 1 else 10**9, [[NAMES[0]]])
    s = kernels.Sentinels(prof.alone)
    with pytest.raises(kernels.ProfilerLost, match=r"lost kernel records at each of 4 tries \(markers before and "
                                                   r"after the call: 4\+4, 12\+12, 28\+28, 60\+60; device events "
                                                   r"seen: 0, 0, 0, 0\)"):
        s.kernels(prof.record)
    # the process's note at exit, on stderr and appended to $MATMUL_DRIFT_PROFILER_NOTES
    notes = tmp_path / "notes.txt"
    notes.write_text("an earlier process's note\n")
    monkeypatch.setenv(kernels.NOTES_ENV, str(notes))
    monkeypatch.setattr(kernels, "_SENTINELS", [s])
    kernels._report_at_exit()
    line = "the profiler lost kernel records; of 1 traced calls, 0 were traced again with more markers and 1 given " \
           "up; markers now 124 before a call and 124 after it"
    assert capsys.readouterr().err == f"matmul-drift: note: {line}\n"
    assert notes.read_text().splitlines()[0] == "an earlier process's note"
    assert notes.read_text().splitlines()[1].startswith(f"{line} (")
    monkeypatch.setattr(sys, "stderr", None)  # stderr closed: nothing raised, nothing on stdout
    kernels._report_at_exit()
    assert capsys.readouterr().out == "" and len(notes.read_text().splitlines()) == 3


def test_without_markers_the_lists_go_unchecked_and_say_so(capsys):
    prof = LossyProfiler(lambda k: 0, [[NAMES[1]]])
    s = kernels.Sentinels(lambda pad: [])
    assert s.marks is None and "CUDA kernel lists go unchecked" in capsys.readouterr().err
    assert s.kernels(prof.record) == [NAMES[1]]


def test_session_events_are_the_profilers_own_events_in_its_order():
    """The fast reader gives what prof.events() gives, name for name and device for device, in
    the same order: over a session of many small ops, a product and a copy (and on CUDA, where
    there is one, the device's kernels too)."""
    import torch
    from torch.profiler import ProfilerActivity

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if "cuda" in devices else [])
    for device in devices:
        a, b = torch.rand(8, 64, device=device), torch.rand(64, 16, device=device)
        byte = torch.zeros(1, dtype=torch.uint8, device=device)
        with kernels.profiled(*activities) as prof:
            for _ in range(50):
                byte.add_(1)
            (a @ b).to(torch.float16)
            a[:, :5].contiguous() @ b[:5]
        want = [(e.name, e.device_type) for e in prof.events()]
        got = [(e.name, e.device_type) for e in kernels.session_events(prof)]
        assert got == want and len(got) > 100, (len(got), len(want))


def test_session_events_sort_kinetos_records_by_time_and_drop_what_prof_events_drops():
    """On CUDA, Kineto hands over the device's records after the CPU's: the reader sorts them
    by start (the longer first on a tie), drops the utility ops and hidden events, and
    demangles names."""
    class Raw:
        def __init__(self, name, device, start, end, hidden=False):
            self._v = (name, device, start, end, hidden)

        def name(self):
            return self._v[0]

        def device_type(self):
            return self._v[1]

        def start_ns(self):
            return self._v[2]

        def end_ns(self):
            return self._v[3]

        def is_hidden_event(self):
            return self._v[4]

    raw = [Raw("aten::mm", "cpu", 10, 50), Raw("cudaLaunchKernel", "cpu", 20, 30), Raw("aten::is_leaf", "cpu", 12, 13),
           Raw("hidden", "cpu", 14, 15, hidden=True), Raw(NAMES[1], "cuda", 60, 70), Raw(NAMES[0], "cuda", 31, 40),
           Raw("_Z11spin_kernell", "cuda", 31, 35)]  # a mangled name is demangled, as prof.events() does
    prof = types.SimpleNamespace(profiler=types.SimpleNamespace(kineto_results=types.SimpleNamespace(
        events=lambda: raw)))
    assert [(e.name, e.device_type) for e in kernels.session_events(prof)] == [
        ("aten::mm", "cpu"), ("cudaLaunchKernel", "cpu"), (NAMES[0], "cuda"), ("spin_kernel(long)", "cuda"),
        (NAMES[1], "cuda")]


def test_device_names_keep_the_device_events_in_order_and_every_repeat():
    class Event:
        def __init__(self, name, device_type):
            self.name, self.device_type = name, device_type

    events = [Event("cudaLaunchKernel", "cpu"), Event("void spin_kernel(long)", "cuda"),
              Event("aten::mm", "cpu"), Event(NAMES[0], "cuda"), Event(NAMES[0], "cuda"),
              Event("Memset (Device)", "cuda")]
    assert kernels.device_names(events, "cuda") == [SPIN, NAMES[0], NAMES[0], "Memset"]


def test_kineto_notes_are_dropped_from_captured_stderr_and_the_rest_passes_on(capsys):
    # torch 2.14.1+cu130 on a machine without a GPU: Kineto's first session printed this ERROR
    # line on stderr, so every CPU explain, scan and order began with it
    text = ("USDT:2026-12-03 12:22:17 19831:19831 SyncActivityProfilerHandler.cpp:39] profiler_start\n"
            "ERROR:2026-12-03 12:22:17 19831:19831 DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35\n"
            "a library's own warning\n"
            "USDT:2026-12-03 12:22:17 19831:19831 SyncActivityProfilerHandler.cpp:46] profiler_stop\n"
            "ERROR: something else failed\n")
    kernels._pass_on_stderr(text)
    assert capsys.readouterr().err == "a library's own warning\nERROR: something else failed\n"


def test_a_cpu_route_prints_nothing_on_stderr_in_a_fresh_process():
    # a process's first profiler session is where Kineto speaks, whichever torch build runs
    code = "import torch; from matmul_drift.measure import kernels; a = torch.ones(2, 2); print(kernels.cpu_route(lambda: a @ a)[1])"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "aten::mm" in p.stdout and p.stderr == "", p.stderr


def test_torch_2_11s_profiler_warning_alone_is_silenced(monkeypatch):
    # torch 2.11.0 (the GPU image's build) warns at every profiler's start, once per process:
    # every explain, scan and order there began with it on stderr (the fresh-process test above
    # failed under 2.11.0); torch 2.13 gives none, so here its profiler is made to give it
    import warnings

    import torch

    real = torch.profiler.profile

    class Warns(real):
        def __enter__(self):
            warnings.warn("Warning: Profiler clears events at the end of each cycle.Only events from the current cycle "
                          "will be reported.To keep events across cycles, set acc_events=True.", UserWarning, stacklevel=2)
            return super().__enter__()

    monkeypatch.setattr(torch.profiler, "profile", Warns)
    a = torch.ones(2, 2)

    def call():
        warnings.warn("the computation's own warning", UserWarning, stacklevel=2)
        return a @ a

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _, route = kernels.cpu_route(call)
    assert "aten::mm" in route
    assert [str(w.message) for w in seen] == ["the computation's own warning"]

# torch's own CUDA names, as Kineto hands them over (demangled, with their parameter lists)
SPIN_CUDA = "at::cuda::(anonymous namespace)::spin_kernel(long)"  # torch.cuda._sleep
ADD_CUDA = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctorOnSelf_add<unsigned char>, "
            "std::array<char*, 2ul> >(int, at::native::CUDAFunctorOnSelf_add<unsigned char>, std::array<char*, 2ul>)")
GEMV = [n for tag, n in kernel_names.tagged() if tag == "full" and n.startswith(("nvjet", "void splitKreduce"))][:2]


class FakeBlas:
    """cuBLASLt's logger API as kernels.BlasLog calls it through ctypes: the callback it sets is
    called with bytes, as the library would, wherever a product runs with the level at Trace."""

    def __init__(self):
        self.callback, self.level, self.logged = None, 0, 0

    def cublasLtLoggerSetCallback(self, callback):
        self.callback = callback
        return 0

    def cublasLtLoggerSetLevel(self, level):
        self.level = level
        return 0

    def matmul(self, splits: int):
        if self.level >= 2 and self.callback:
            self.logged += 1
            self.callback(2, b"cublasLtMatmul", f"Adesc=[type=R_16F rows=8 cols=1 ld=8] algo=[algoId=66 "
                                                f"numSplitsK={splits}] workSpaceSizeInBytes=0".encode())


def recipe(splits: int) -> str:
    return f"cuBLASLt cublasLtMatmul R_16F,?,?,? algoId=66 numSplitsK={splits}"


class FakeCuda:
    """torch.cuda and torch.profiler.profile as kernels.cuda_kernels uses them, for a machine
    without a GPU: every launch leaves a CPU runtime record and a device record, and a session's
    records come as Kineto's (the CPU's first, then the device's, each with start_ns, end_ns and
    a DeviceType), less the device's first ``loss(session)`` (pytorch#192021)."""

    def __init__(self, torch, loss):
        self.torch, self.loss, self.session, self.clock, self.calls = torch, loss, 0, 0, 0
        self.cpu, self.device = [], []
        fake = self

        class Scratch:
            def add_(self, value):
                fake.launch("aten::add_", ADD_CUDA)

        class Profile:
            def __init__(self, activities):
                assert torch.profiler.ProfilerActivity.CUDA in activities

            def __enter__(self):
                fake.session += 1
                fake.cpu, fake.device = [], []
                return self

            def __exit__(self, *exc):
                kept = fake.device[min(fake.loss(fake.session), len(fake.device)):]
                raw = fake.cpu + kept
                self.profiler = types.SimpleNamespace(kineto_results=types.SimpleNamespace(events=lambda: raw))

        self.Scratch, self.Profile = Scratch, Profile
        self.blas = FakeBlas()

    def raw(self, name, device_type, start, end):
        return types.SimpleNamespace(name=lambda: name, device_type=lambda: device_type, start_ns=lambda: start,
                                     end_ns=lambda: end, is_hidden_event=lambda: False)

    def launch(self, op, kernel):
        cpu, cuda = self.torch.autograd.DeviceType.CPU, self.torch.autograd.DeviceType.CUDA
        t = self.clock = self.clock + 100
        self.cpu += [self.raw(op, cpu, t, t + 50), self.raw("cudaLaunchKernel", cpu, t + 10, t + 20)]
        self.device.append(self.raw(kernel, cuda, t + 1000, t + 1040))  # the GPU runs behind the host

    def product(self):
        """A traced call: a GEMV and its split-K reduction; its result says which call it was,
        and so does its cuBLASLt recipe (split-K in as many parts as calls so far)."""
        self.calls += 1
        for name in GEMV:
            self.launch("aten::mv", name)
        self.blas.matmul(self.calls)
        return self.calls

    def install(self, monkeypatch):
        torch = self.torch
        empty = torch.empty
        monkeypatch.setattr(torch, "empty", lambda *a, device=None, **kw: self.Scratch() if device == "cuda"
                            else empty(*a, device=device, **kw))
        monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: self.launch("aten::_sleep", SPIN_CUDA), raising=False)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
        monkeypatch.setattr(torch.profiler, "profile", self.Profile)
        monkeypatch.setattr(kernels, "_SENTINELS", [])
        monkeypatch.setattr(kernels, "_BLAS_LOG", [kernels.BlasLog({"lt": self.blas, "blas": None})])
        monkeypatch.setattr(kernels.atexit, "register", lambda fn: None)


def test_cuda_kernels_gives_each_calls_own_kernels_from_torch_shaped_records(monkeypatch):
    """kernels.cuda_kernels end to end on torch's record types (DeviceType enums, Kineto's
    start_ns/end_ns, torch's real spin and byte-add kernel names), under a profiler that loses
    all of its first session, one record more each session after, and once 60 at a time (the
    call is traced again): every call's list is its GEMV and split-K reduction, normalised, and
    the result returned is that same call's, the last try's."""
    import torch

    fake = FakeCuda(torch, lambda session: 60 if session == 20 else grows(session))
    fake.install(monkeypatch)
    for i in range(40):
        result, names = kernels.cuda_kernels(fake.product)
        assert names == [kernels.normalise_cuda(n) for n in GEMV] + [recipe(result)] and result == fake.calls, (i, names)
    assert fake.blas.logged == fake.calls and fake.blas.level == 0  # each call logged once, logging off after
    s = kernels._SENTINELS[0]
    assert s.marks == (kernels.normalise_cuda(SPIN_CUDA), kernels.normalise_cuda(ADD_CUDA))
    assert s.marks[0] == "at::cuda::(anonymous namespace)::spin_kernel" and s.failed == 0 and s.lost[0] >= 40
    assert s.retried == 1 and fake.calls == 41  # one call traced twice, its second result returned


def test_cuda_kernels_says_no_kernel_where_the_call_launched_none(monkeypatch):
    import torch

    fake = FakeCuda(torch, lambda session: 0)
    fake.install(monkeypatch)
    assert kernels.cuda_kernels(lambda: "empty") == ("empty", ["(no kernel)"])
    assert kernels._SENTINELS[0].report() is None
