"""free_port: a loopback port below the kernel's source ports for outgoing connections (which
could take it before its process binds it), free, and never handed out twice."""

import socket
from collections.abc import Iterator

import pytest

from gpushare_harness import controlplane
from gpushare_harness.controlplane import free_port


@pytest.fixture
def ephemeral_low() -> int:
    low = controlplane._ephemeral_range()[0]
    if low < 21024:
        pytest.skip(f"this host's ephemeral range starts at {low}: free_port asks the kernel")
    return low


def drawing(monkeypatch: pytest.MonkeyPatch, ports: list[int]) -> None:
    """free_port draws `ports` in turn."""
    draws: Iterator[int] = iter(ports)
    monkeypatch.setattr("secrets.randbelow", lambda _: next(draws) - 20000)


def test_a_free_port_is_below_the_kernels_outgoing_source_ports_and_bindable(
    ephemeral_low: int,
) -> None:
    ports = {free_port() for _ in range(20)}
    assert len(ports) == 20
    assert all(20000 <= port < ephemeral_low for port in ports)
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
            listener.bind(("127.0.0.1", port))


def test_a_port_listened_on_is_not_given(
    ephemeral_low: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken, other = free_port(), free_port()
    controlplane._handed_out.difference_update({taken, other})
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", taken))
        listener.listen()
        drawing(monkeypatch, [taken, other])
        assert free_port() == other


def test_a_port_handed_out_is_not_handed_out_again(
    ephemeral_low: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = free_port(), free_port()
    controlplane._handed_out.discard(second)
    drawing(monkeypatch, [first, second])
    assert free_port() == second
