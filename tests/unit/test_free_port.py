import socket

from gpushare_harness.controlplane import free_port


def test_a_free_port_is_below_the_kernels_outgoing_source_ports_and_bindable() -> None:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
        ephemeral_low = int(ranges.read().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(20000 <= port < ephemeral_low for port in ports)
    assert len(ports) > 1  # chosen afresh each time
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
            listener.bind(("127.0.0.1", port))


def test_a_port_listened_on_is_not_given() -> None:
    taken = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", taken))
        listener.listen()
        assert taken not in {free_port() for _ in range(200)}
