"""Rank processes for the tests of collective autotuning, as users' jobs run them.

``RankProcessesTestCase`` starts ``WORLD_SIZE`` rank processes once per class
(``MultiProcContinuousTest``) and runs every test of the class in all of them:
a class pays process start-up and ``import torch`` once, instead of once per
test.  Each rank joins the process group through a ``TCPStore`` (what torchrun
gives a job), found through the class's rendezvous file, and keeps Inductor's
caches on, in a cache directory per rank that the run's tests share.

Before each test, every rank runs :meth:`RankProcessesTestCase.reset_rank`
(the test's ``setUp`` runs in the parent process only): Dynamo is reset and
the parts of the cache directory that hold collective decisions are emptied,
because what these tests assert is what a compile benchmarks, which a
decision taken from a cache skips.  A test that fails poisons its class: the
remaining tests of the class are skipped, since its ranks may no longer be in
step.  A rank still inside a test when the parent gives up on it prints every
thread's stack (``faulthandler``) and is killed when the class ends, so that
a hung test fails with where it hung instead of hanging the run.

Tests whose point is a rank that dies, or ranks that leave a test at
different points, use ``SpawnedRanksTestCase``: fresh processes per test
(``MultiProcessTestCase``), each test initializing the process group itself
(:meth:`SpawnedRanksTestCase._init_process_group`).

A rank process runs its class's ``setUpClass`` before any test, as the
parent does: a class-level fixture such as
``@torch._inductor.config.patch(...)`` holds in every rank, where the
tests compile.

Both run on gloo (CPU); a class with ``backend = "nccl"`` runs on one GPU per
rank and is skipped where there are not enough GPUs.  A class with
``bare_init`` set initializes the process group as torchrun's examples do,
``init_process_group()`` without a backend: c10d then picks a backend per
device type (``cpu:gloo``, or ``cpu:gloo,cuda:nccl`` on a GPU machine), and
``get_backend()`` says ``"undefined"``.
"""

from __future__ import annotations

import atexit
import datetime
import faulthandler
import os
import shutil
import signal
import tempfile
import unittest
from typing import Any

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters
from torch._inductor.runtime.collective_benchmarking import decision_cache
from torch.testing._internal.common_distributed import (
    get_timeout,
    MultiProcContinuousTest,
    MultiProcessTestCase,
)
from torch.testing._internal.common_utils import TestCase


__all__ = [
    "DECISION_CACHES",
    "OneRankGlooTestCase",
    "RankProcessesTestCase",
    "SpawnedRanksTestCase",
    "cache_root",
    "forget_remembered_decisions",
    "one_rank_file_store",
    "rank_device",
    "reset_for_a_test",
    "skip_without_gpus",
    "tcp_store_through",
    "use_rank_cache_dir",
]


# The parts of an Inductor cache directory that can hold a collective
# decision: compiled programs (FX graph and AOTAutograd caches, which replay
# the decisions they were compiled with) and the decisions themselves.
DECISION_CACHES = ("fxgraph", "aotautograd", "collective_decisions")
# Where the rank processes of a test run keep their cache directories.
CACHE_ROOT_ENV = "COLLECTIVE_TESTS_CACHE_ROOT"


def cache_root() -> str:
    """The run's root of per-rank cache directories (made once, inherited by ranks)."""
    if CACHE_ROOT_ENV not in os.environ:
        os.environ[CACHE_ROOT_ENV] = tempfile.mkdtemp(
            prefix="collective-tests-inductor-"
        )
        atexit.register(shutil.rmtree, os.environ[CACHE_ROOT_ENV], ignore_errors=True)
    return os.environ[CACHE_ROOT_ENV]


def use_rank_cache_dir(rank: int) -> str:
    """Point Inductor at this rank's cache directory, decision-holding parts emptied."""
    cache_dir = os.path.join(cache_root(), f"rank{rank}")
    for part in DECISION_CACHES:
        shutil.rmtree(os.path.join(cache_dir, part), ignore_errors=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    return cache_dir


def tcp_store_through(file_name: str, rank: int, world_size: int) -> dist.TCPStore:
    """A TCPStore hosted by rank 0, its port passed to the others through ``file_name``."""
    rendezvous = dist.FileStore(file_name, world_size)
    timeout = datetime.timedelta(seconds=60)
    if rank == 0:
        store = dist.TCPStore(
            "127.0.0.1", 0, world_size, True, timeout=timeout, wait_for_workers=False
        )
        rendezvous.set("tcp_port", str(store.port))
        return store
    port = int(rendezvous.get("tcp_port"))
    return dist.TCPStore("127.0.0.1", port, world_size, False, timeout=timeout)


def one_rank_file_store(test: unittest.TestCase) -> dist.FileStore:
    """A store for a one-rank group in the test's own process, removed after the test.

    A ``FileStore`` deletes its file only when its last reference goes.
    """
    directory = tempfile.TemporaryDirectory(prefix="collective-store-")
    test.addCleanup(directory.cleanup)
    return dist.FileStore(os.path.join(directory.name, "store"), 1)


class OneRankGlooTestCase(TestCase):
    """A one-rank gloo group in the test's own process, for each test."""

    def setUp(self) -> None:
        super().setUp()
        store = one_rank_file_store(self)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)

    def tearDown(self) -> None:
        dist.destroy_process_group()
        super().tearDown()


def skip_without_gpus(backend: str, world_size: int) -> None:
    """Skip an NCCL class where there is not a GPU for each rank."""
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise unittest.SkipTest(f"NCCL tests need {world_size} GPUs")


def rank_device(backend: str, rank: int) -> torch.device:
    """The device of ``rank``'s tensors (its GPU under NCCL), made current."""
    if backend != "nccl":
        return torch.device("cpu")
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    return device


def reset_for_a_test(rank: int) -> None:
    """What every test starts with on every rank (see the module docstring)."""
    torch._dynamo.reset()
    counters.clear()
    use_rank_cache_dir(rank)
    forget_remembered_decisions()


def forget_remembered_decisions() -> None:
    """Clear the collective decisions this process remembers (not those on disk)."""
    decision_cache._remembered.clear()
    decision_cache._pre_agreed.clear()


class RankProcessesTestCase(MultiProcContinuousTest):
    """``WORLD_SIZE`` ranks, started once for the class; see the module docstring."""

    WORLD_SIZE = 2
    backend = "gloo"
    # Initialize without naming a backend (see the module docstring).
    bare_init = False
    # The process group's own timeout: a test that hangs in a collective of
    # its program fails after it rather than after c10d's 30 minutes.
    timeout = datetime.timedelta(seconds=300)
    # How long tearDownClass waits for the ranks to leave their last test.
    EXIT_WAIT_S = 60
    # Set by MultiProcContinuousTest when it spawns the ranks.
    processes: list[Any]
    task_queues: list[Any]

    @classmethod
    def backend_str(cls) -> str:
        return cls.backend

    @classmethod
    def device_type(cls) -> str:
        return "cuda" if cls.backend == "nccl" else "cpu"

    def assertRaisesRegex(  # type: ignore[override]
        self, expected_exception: Any, expected_regex: Any, *args: Any, **kwargs: Any
    ) -> Any:
        # common_utils.TestCase.assertRaisesRegex drops the regex when
        # ``self.device_type`` is not a native device's name, and on this class
        # it is a classmethod (MultiProcContinuousTest's), never a name: every
        # message would match.  Check the message, as unittest does.
        return unittest.TestCase.assertRaisesRegex(
            self, expected_exception, expected_regex, *args, **kwargs
        )

    @classmethod
    def setUpClass(cls) -> None:
        skip_without_gpus(cls.backend, cls.WORLD_SIZE)
        cls.world_size = cls.WORLD_SIZE
        if cls.rank >= 0:
            # In a rank process (see _init_pg): the class's fixtures only.
            super().setUpClass()
            return
        cache_root()  # made in the parent, so that every rank shares the root
        # MultiProcContinuousTest starts its ranks with the process-wide start
        # method, and sets spawn only when none is set: once any earlier test
        # has started a process (which fixes it, to fork), the ranks would
        # fork from the test runner, inheriting its threads and compile pools.
        torch.multiprocessing.set_start_method("spawn", force=True)
        super().setUpClass()

    @classmethod
    def _init_pg(cls, rank: int, world_size: int, rdvz_file: str | None) -> None:
        if rdvz_file is None:
            raise AssertionError(
                "MultiProcContinuousTest gives every rank the rendezvous file"
            )
        # A rank is a fresh interpreter that runs the class's tests but not
        # its setUpClass: run it here, so that what a class-level decorator
        # sets (a config.patch) holds where the tests compile.
        cls.setUpClass()
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        rank_device(cls.backend, rank)
        dist.init_process_group(
            None if cls.bare_init else cls.backend,
            store=tcp_store_through(rdvz_file, rank, world_size),
            rank=rank,
            world_size=world_size,
            timeout=cls.timeout,
        )
        use_rank_cache_dir(rank)

    @classmethod
    def _run_test_given_id(cls, test_id: str, **kwargs: Any) -> None:
        test = cls(test_id.rsplit(".", maxsplit=1)[-1])
        test.rank, test.world_size = cls.rank, cls.world_size
        test.reset_rank()
        # Every rank starts the test together: no rank's compile races a
        # peer still finishing the previous test.
        dist.barrier()
        # Where a rank is when the parent stops waiting for it (get_timeout
        # per rank), printed while the parent still captures the test's output.
        faulthandler.dump_traceback_later(get_timeout(test_id) * 0.9)
        try:
            getattr(test, test._testMethodName)(**kwargs)
        finally:
            faulthandler.cancel_dump_traceback_later()

    @classmethod
    def tearDownClass(cls) -> None:
        # MultiProcContinuousTest joins its ranks without a timeout: a rank
        # stuck in a test the parent gave up on would hang the run.
        if cls.rank < 0 and cls.__dict__.get("_processes_spawned", False):
            for task_queue in cls.task_queues:
                task_queue.put(None)
            for process in cls.processes:
                process.join(cls.EXIT_WAIT_S)
            for process in cls.processes:
                if process.is_alive() and process.pid is not None:
                    os.kill(process.pid, signal.SIGUSR1)  # its stacks, then gone
                    process.join(5)
                    process.kill()
                    process.join()
        super().tearDownClass()

    def reset_rank(self) -> None:
        """Per-test reset on every rank; extend it for a test module's own state."""
        reset_for_a_test(self.rank)

    def _init_rank(self) -> torch.device:
        """This rank's device; the process group is the class's."""
        return rank_device(self.backend, self.rank)


class SpawnedRanksTestCase(MultiProcessTestCase):
    """``WORLD_SIZE`` rank processes per test; each test initializes the process group."""

    WORLD_SIZE = 2
    backend = "gloo"
    # Tests whose point is a rank that dies: the dead rank's exit code is not
    # checked, the healthy ranks' assertions still fail the test through theirs.
    KILLS_A_RANK: tuple[str, ...] = ()

    @classmethod
    def setUpClass(cls) -> None:
        skip_without_gpus(cls.backend, cls.WORLD_SIZE)
        super().setUpClass()

    @classmethod
    def _run(
        cls, rank: int, test_name: str, file_name: str, parent_pipe: Any, **kwargs: Any
    ) -> None:
        # As RankProcessesTestCase._init_pg: the class's fixtures hold in the rank.
        cls.setUpClass()
        super()._run(rank, test_name, file_name, parent_pipe, **kwargs)

    @property
    def world_size(self) -> int:
        return self.WORLD_SIZE

    def setUp(self) -> None:
        super().setUp()
        if self._testMethodName in self.KILLS_A_RANK:
            self.skip_return_code_checks.append(
                getattr(type(self), self._testMethodName).__get__(self)
            )
        cache_root()  # the rank processes inherit it
        self._spawn_processes()

    def reset_rank(self) -> None:
        """Per-test reset on every rank; extend it for a test module's own state."""
        reset_for_a_test(self.rank)

    def _init_process_group(self) -> None:
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group(
            self.backend, store=store, rank=self.rank, world_size=self.world_size
        )
        self.reset_rank()

    def _init_rank(self) -> torch.device:
        """This rank's device, with the process group initialized."""
        device = rank_device(self.backend, self.rank)
        self._init_process_group()
        return device
