"""The xdist workers' turns (tests/conftest.py `_Turns`): a module of `ALONE` runs with no test of the other worker
beside it, from its first test to its last; other tests run side by side. Two `_Turns` on one folder stand for the
two workers (flock locks of two open files conflict within one process too)."""

from __future__ import annotations

import threading
from pathlib import Path

from conftest import ALONE, _Turns

ALONE_MODULE = "test_services_fairness"
OTHER, ANOTHER = "test_core_gm", "test_lm_order"
BLOCKED_FOR = 0.3  # a taker still waiting after this long is blocked (a lock taken is taken at once)


def _take_in_thread(turns: _Turns, module: str) -> threading.Event:
    taken = threading.Event()

    def take() -> None:
        turns.take(module)
        taken.set()

    threading.Thread(target=take, daemon=True).start()
    return taken


def test_the_list_names_the_real_cpu_modules() -> None:
    assert ALONE_MODULE in ALONE
    assert OTHER not in ALONE and ANOTHER not in ALONE
    tests = Path(__file__).parent
    assert all((tests / f"{module}.py").is_file() for module in ALONE)


def test_two_other_tests_run_side_by_side(tmp_path: Path) -> None:
    one, two = _Turns(tmp_path), _Turns(tmp_path)
    one.take(OTHER)
    assert _take_in_thread(two, ANOTHER).wait(5)
    one.give_back(None)
    two.give_back(None)


def test_a_module_alone_waits_for_the_other_test_and_keeps_the_machine_to_its_last_test(tmp_path: Path) -> None:
    one, two = _Turns(tmp_path), _Turns(tmp_path)
    one.take(OTHER)
    alone = _take_in_thread(two, ALONE_MODULE)
    assert not alone.wait(BLOCKED_FOR)  # the other worker's test is still running
    # While the alone module waits, no new test starts beside the running one (else two workers taking turns at
    # shorter tests could keep it waiting for ever).
    third = _take_in_thread(_Turns(tmp_path), ANOTHER)
    assert not third.wait(BLOCKED_FOR)
    one.give_back(OTHER)
    after = _take_in_thread(one, OTHER)
    assert alone.wait(5)
    assert not after.wait(BLOCKED_FOR)
    assert not third.is_set()
    two.give_back(ALONE_MODULE)  # the module's next test: still alone
    two.take(ALONE_MODULE)
    assert not after.wait(BLOCKED_FOR)
    two.give_back(None)  # its last test ended
    assert after.wait(5) and third.wait(5)
    one.give_back(None)


def test_a_module_alone_holds_off_a_test_that_comes_after_it(tmp_path: Path) -> None:
    one, two = _Turns(tmp_path), _Turns(tmp_path)
    one.take(ALONE_MODULE)
    other = _take_in_thread(two, OTHER)
    assert not other.wait(BLOCKED_FOR)
    one.give_back(OTHER)
    assert other.wait(5)
    two.give_back(None)
