"""CUDA kernel lists checked by sentinels, without a GPU: the profiler's known loss of each
session's first records (pytorch/pytorch#192021: the k-th session loses its first k; the very
first can lose all, pytorch/kineto#996) simulated over real cuBLAS kernel names."""

from __future__ import annotations

import random

import pytest

from matmul_drift import kernels

import kernel_names

SPIN = "spin_kernel"  # torch.cuda._sleep's kernel, as normalise_cuda gives "void spin_kernel(long)"
NAMES = [kernels.normalise_cuda(n) for tag, n in kernel_names.tagged() if tag == "full"]


class LossyProfiler:
    """Sessions as torch.profiler gives them: the sentinels, the call's kernels, the tail
    sentinel, less the first ``loss(session)`` records."""

    def __init__(self, loss, truths):
        self.loss, self.truths, self.session, self.calls = loss, truths, 0, 0

    def alone(self, pad: int) -> list[str]:
        return self._lose([SPIN] * pad)

    def record(self, pad: int) -> list[str]:
        self.calls += 1
        truth = self.truths[self.current]
        return self._lose([SPIN] * pad + truth + [SPIN] * (kernels.TAIL if pad else 0))

    def _lose(self, names: list[str]) -> list[str]:
        self.session += 1
        return names[self.loss(self.session):len(names) - self.tail_loss]

    tail_loss = 0


def grows(session: int) -> int:
    """#192021: everything in the first session, then one more record each session."""
    return 10**9 if session == 1 else session


def test_the_sentinel_is_the_kernel_torch_cuda_sleep_launches():
    assert kernels.normalise_cuda("void spin_kernel(long)") == SPIN


@pytest.mark.parametrize("names, want", [
    ([SPIN] * 4 + ["a", "b"] + [SPIN] * 4, (["a", "b"], 0)),
    ([SPIN] * 2 + ["a", "a"] + [SPIN] * 4, (["a", "a"], 2)),  # a kernel launched twice stays twice
    ([SPIN] + ["a"] + [SPIN], (["a"], 3)),  # the last records lost too: a tail sentinel is left
    (["a"] + [SPIN] * 4, None),  # every head sentinel lost: "a" may not be the call's first kernel
    ([SPIN] * 4 + ["a"], None),  # no tail: the call's last kernels may be missing
    ([SPIN] * 8, ([], 0)),  # the call launched nothing (an empty product)
    ([SPIN] * 5, ([], 3)),
    ([SPIN] * 4, None),  # the tail alone: the call's kernels may all be lost
    ([], None),
])
def test_a_list_is_whole_only_between_surviving_sentinels(names, want):
    assert kernels.bracketed(names, SPIN, 4) == want


def test_kernel_lists_stay_whole_while_the_profiler_loses_more_each_session():
    rng = random.Random(5)
    truths = [[rng.choice(NAMES) for _ in range(rng.randint(0, 3))] for _ in range(300)]
    truths[7] = [NAMES[0], NAMES[0]]
    prof = LossyProfiler(grows, truths)
    s = kernels.Sentinels(prof.alone)
    assert s.name == SPIN
    for prof.current, truth in enumerate(truths):
        assert s.kernels(prof.record) == truth
    # one try a call, while the loss rose past 300 records a session; the padding kept ahead
    assert prof.calls == 300 and prof.session == 302 and 302 < s.pad < 2 * 302 + 8
    # the same sessions without sentinels: the old lists read "(no kernel)"
    bare = LossyProfiler(grows, truths)
    bare.current = 7
    assert [bare.record(0) for _ in range(3)] == [[], [], []]


def test_a_profiler_that_loses_the_last_records_instead_is_covered_by_the_tail():
    truths = [[NAMES[i % len(NAMES)], NAMES[0]] for i in range(20)] + [[]]
    prof = LossyProfiler(lambda k: k % 3, truths)
    prof.tail_loss = kernels.TAIL - 1
    s = kernels.Sentinels(prof.alone)
    for prof.current, truth in enumerate(truths):
        assert s.kernels(prof.record) == truth
    assert prof.calls == len(truths)


def test_a_profiler_that_loses_every_try_is_one_clear_error():
    prof = LossyProfiler(lambda k: 0 if k == 1 else 10**9, [[NAMES[0]]])
    prof.current = 0
    s = kernels.Sentinels(prof.alone)
    with pytest.raises(kernels.ProfilerLost, match=r"lost kernel records at each of 4 tries \(sentinels before the "
                                                   r"call: 4, 12, 28, 60; device events seen: 0, 0, 0, 0\)"):
        s.kernels(prof.record)


def test_without_a_sentinel_the_lists_go_unchecked_and_say_so(capsys):
    prof = LossyProfiler(lambda k: 0, [[NAMES[1]]])
    prof.current = 0
    s = kernels.Sentinels(lambda pad: [])
    assert s.name is None and "CUDA kernel lists go unchecked" in capsys.readouterr().err
    assert s.kernels(prof.record) == [NAMES[1]]


def test_device_names_keep_the_device_events_in_order_and_every_repeat():
    class Event:
        def __init__(self, name, device_type):
            self.name, self.device_type = name, device_type

    events = [Event("cudaLaunchKernel", "cpu"), Event("void spin_kernel(long)", "cuda"),
              Event("aten::mm", "cpu"), Event(NAMES[0], "cuda"), Event(NAMES[0], "cuda"),
              Event("Memset (Device)", "cuda")]
    assert kernels.device_names(events, "cuda") == [SPIN, NAMES[0], NAMES[0], "Memset"]
