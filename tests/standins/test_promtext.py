"""The stand-ins' Prometheus pages are spelled as Consul 1.22's and Nomad's Go exposition writes them."""

from __future__ import annotations

from lab.standins.promtext import Series, render


def test_render_matches_go_exposition():
    nan = float("nan")
    text = render([
        Series("consul_kvs_apply", "summary", quantiles={0.99: 1.5, 0.5: 0.25, 0.9: nan}, count=7, total=2.0),
        Series("consul_raft_boltdb_freelistBytes", "gauge", 1234567.0),
        Series("consul_server_isLeader", "gauge", 1.0),
        Series("nomad_client_allocations_running", "gauge", 0.0, {"node_id": "n1", "host": 'a"b'}),
        Series("nomad_client_allocations_running", "gauge", 3.0, {"node_id": "n2", "host": "c"}),
    ])
    assert text == (
        "# HELP consul_kvs_apply consul_kvs_apply\n"
        "# TYPE consul_kvs_apply summary\n"
        'consul_kvs_apply{quantile="0.5"} 0.25\n'
        'consul_kvs_apply{quantile="0.9"} NaN\n'
        'consul_kvs_apply{quantile="0.99"} 1.5\n'
        "consul_kvs_apply_sum 2\n"
        "consul_kvs_apply_count 7\n"
        "# HELP consul_raft_boltdb_freelistBytes consul_raft_boltdb_freelistBytes\n"
        "# TYPE consul_raft_boltdb_freelistBytes gauge\n"
        "consul_raft_boltdb_freelistBytes 1.234567e+06\n"
        "# HELP consul_server_isLeader consul_server_isLeader\n"
        "# TYPE consul_server_isLeader gauge\n"
        "consul_server_isLeader 1\n"
        "# HELP nomad_client_allocations_running nomad_client_allocations_running\n"
        "# TYPE nomad_client_allocations_running gauge\n"
        'nomad_client_allocations_running{host="a\\"b",node_id="n1"} 0\n'
        'nomad_client_allocations_running{host="c",node_id="n2"} 3\n'
    )
