"""vLLM's data-parallel load balancer as a router (``--router vllm-dp``)."""
import pytest


def test_vllm_dp_balance_scores_waiting_four_times_running():
    """vllm-dp: vLLM's DP load balancer, the lowest 4 waiting + running (waiting = in flight - running), the lowest
    index on ties; least-outstanding would pick the other replica here."""
    from sim.serving.router import Arrival, RouterError, make_router
    rt = make_router("vllm-dp", 2)
    a = Arrival(0, 0, 1, (1,))
    assert rt.route(a, [3, 2], [3, 0]) == 0            # scores 3 and 8
    assert make_router("least-outstanding", 2).route(a, [3, 2]) == 1
    assert rt.route(a, [2, 2], [1, 1]) == 0            # a tie: the lowest index
    assert rt.route(a, [5, 1], [1, 0]) == 1            # scores 17 and 4
    with pytest.raises(RouterError, match="running"):
        rt.route(a, [1, 1])


def test_vllm_dp_balance_runs_behind_both_drivers():
    """Both multi-replica drivers pass the running counts (bench's and the trace commands')."""
    from sim.bench import plain
    from sim.cost.profiles import load_hardware, load_model
    wl = plain.random_workload(40, 256, 32)
    run = plain.run(load_model("qwen3-30b-a3b"), load_hardware("h100-sxm"), wl, data_parallel_size=2,
                    enable_expert_parallel=True, router="vllm-dp", request_rate=20.0)
    assert run.info["router"] == "vllm-dp" and sorted(set(run.replica.tolist())) == [0, 1]
