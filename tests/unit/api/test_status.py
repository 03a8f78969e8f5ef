"""The app's own routes and limits in process against a stand-in engine (tests/apiutil.py): API keys
and their per-minute limits, /health, /cluster/status, the page, /metrics, and the prompts
prefilling now in both."""

import json
from dataclasses import replace

import pytest
from apiutil import HOSTS, MODEL, client, rank_row, samples

from mlx_ring.api.keys import load_keys
from mlx_ring.serving.port import PrefillProgress, QueueFull

HI = [{"role": "user", "content": "Hi"}]


def scrape(http) -> dict:
    r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=")
    return samples(r.text)


def keys_file(tmp_path, rows) -> list:
    (tmp_path / "keys.json").write_text(json.dumps(rows))
    return load_keys(None, tmp_path / "keys.json")


def test_keys_guard_v1_only_and_each_keys_requests_per_minute(tmp_path, engine, served):
    keys = keys_file(
        tmp_path,
        [
            {"name": "alice", "key": "sk-alice-secret-1", "rpm": 2},
            {"name": "ci", "key": "sk-ci-secret-22"},
        ],
    )
    with client(engine, served, keys) as http:

        def ask(key):
            return http.post(
                "/v1/chat/completions",
                json={"messages": HI},
                headers={"Authorization": f"Bearer {key}"} if key else {},
            )

        for key in (None, "sk-nobody-000", "sk-alice-secret"):
            r = ask(key)
            assert r.status_code == 401 and r.json()["error"] == {
                "message": "missing or wrong API key; send Authorization: Bearer <key>",
                "type": "authentication_error",
                "param": None,
                "code": "invalid_api_key",
            }
        assert http.get("/v1/models").status_code == 401
        # open without a key
        assert http.get("/health").status_code == 200 and http.get("/metrics").status_code == 200
        assert engine.submitted == []
        assert [ask("sk-alice-secret-1").status_code for _ in range(2)] == [200, 200]
        r = ask("sk-alice-secret-1")  # a third request in the minute
        assert r.status_code == 429 and 1 <= int(r.headers["retry-after"]) <= 60
        assert r.json()["error"] == {
            "message": "rate limit reached for key 'alice': 2 requests per minute; retry later",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
        # no limits
        assert [ask("sk-ci-secret-22").status_code for _ in range(3)] == [200, 200, 200]
        assert len(engine.submitted) == 5
        assert (
            scrape(http)[
                (
                    "mlx_ring_requests_total",
                    (("endpoint", "/v1/chat/completions"), ("status", "401")),
                )
            ]
            == 3
        )


def test_tokens_per_minute_reserve_prompt_plus_max_tokens_then_settle_at_use(
    tmp_path, engine, served
):
    (bob,) = keys_file(tmp_path, [{"name": "bob", "key": "sk-bob-secret-22", "tpm": 200}])
    prompt = len(served.tokenizer.apply_chat_template(HI, add_generation_prompt=True))
    answer = len(engine.answer_ids()) + 1
    with client(engine, served, [bob]) as http:

        def ask(max_tokens):
            return http.post(
                "/v1/chat/completions",
                json={"messages": HI, "max_tokens": max_tokens},
                headers={"Authorization": "Bearer sk-bob-secret-22"},
            )

        r = ask(200)  # can never fit
        assert r.status_code == 429 and r.headers["retry-after"] == "60"
        assert r.json()["error"]["message"] == (
            f"this request may use {prompt + 200} tokens (prompt + max_tokens), over the 200 "
            "tokens per minute of key 'bob'; lower max_tokens"
        )
        r = ask(100)  # reserves prompt + 100, settles at what it used
        assert r.status_code == 200 and r.json()["usage"]["total_tokens"] == prompt + answer
        left = 200 - (prompt + answer)
        r = ask(left - prompt + 1)  # one token more than the minute has left
        assert r.status_code == 429 and r.json()["error"]["type"] == "tokens"
        assert (
            r.json()["error"]["message"]
            == "rate limit reached for key 'bob': 200 tokens per minute; retry later"
        )
        engine.refuse = QueueFull("full")
        # refused by the engine: it used none of the minute
        assert ask(left - prompt).status_code == 503
        engine.refuse = None
        assert ask(left - prompt).status_code == 200  # exactly what is left
    # what each used; refused ones none
    assert [t for _, t in bob.tokens] == [prompt + answer, 0, prompt + answer]


def test_health_cluster_status_and_the_page(engine, served):
    with client(engine, served) as http:
        h = http.get("/health").json()
        assert h["status"] == "ok" and h["ranks"] == 2 and h["ring_round_trip_ms"] >= 0
        s = http.get("/cluster/status").json()
        assert s["model"] == MODEL and s["plan"] == served.cluster.to_json()["plan"]
        assert s["ranks"] == [
            static | rank_row(r) for r, static in enumerate(served.cluster.to_json()["ranks"])
        ]
        assert s["queued_requests"] == 0 and s["waiting_prompts"] == 0
        assert s["prompt_cache"] == {
            "enabled": True,
            "entries": 2,
            "tokens": 300,
            "budget_tokens": 4000,
            "hits": 5,
            "hit_tokens": 120,
            "block_tokens": 0,
            "disk_hit_tokens": 0,
        }
        assert s["speculative"] == {"draft_tokens": 0, "drafted": 0, "accepted": 0}
        engine.snapshot = replace(
            engine.snapshot,
            prompt_cache=None,
            queued=3,
            draft_tokens=6,
            drafted=40,
            accepted=31,
            waiting=2,
        )
        s = http.get("/cluster/status").json()
        assert (
            s["prompt_cache"] == {"enabled": False}
            and s["queued_requests"] == 3
            and s["waiting_prompts"] == 2
        )
        assert s["speculative"] == {"draft_tokens": 6, "drafted": 40, "accepted": 31}
        page = http.get("/")
        assert (
            page.status_code == 200
            and page.headers["content-type"].startswith("text/html")
            and "/cluster/status" in page.text
        )


def test_a_broken_or_silent_ring_is_a_503_and_metrics_still_answer(engine, served):
    with client(engine, served) as http:
        engine.ping_error = TimeoutError("no answer")
        r = http.get("/health")
        assert r.status_code == 503 and r.json() == {"status": "unhealthy", "error": "no answer"}
        r = http.get("/cluster/status")
        assert r.status_code == 503 and r.json()["error"] == {
            "message": "the ring did not answer: no answer",
            "type": "server_error",
            "param": None,
            "code": None,
        }
        engine.snapshot = replace(engine.snapshot, broken="a ring step got no answer within 60 s")
        r = http.get("/health")
        assert r.status_code == 503 and r.json() == {
            "status": "unavailable",
            "error": "a ring step got no answer within 60 s",
        }
        m = scrape(http)
        assert m[("mlx_ring_up", ())] == 0 and not any(
            name.startswith("mlx_ring_rank_") for name, _ in m
        )
        engine.snapshot = replace(engine.snapshot, broken=None, stopping=True)
        assert http.get("/health").json() == {"status": "unavailable", "error": "shutting down"}


def test_metrics_count_requests_tokens_and_show_every_ranks_figures(engine, served):
    with client(engine, served) as http:
        before = scrape(http)
        r = http.post(
            "/v1/chat/completions",
            json={"messages": HI, "stream": True, "stream_options": {"include_usage": True}},
        )
        usage = json.loads(r.text.split("\n\n")[-3][6:])["usage"]
        assert http.post("/v1/chat/completions", json={"messages": []}).status_code == 400
        after = scrape(http)
    chat = ("mlx_ring_requests_total", (("endpoint", "/v1/chat/completions"), ("status", "200")))
    bad = ("mlx_ring_requests_total", (("endpoint", "/v1/chat/completions"), ("status", "400")))
    assert before.get(chat, 0) == before.get(bad, 0) == 0 and after[chat] == after[bad] == 1
    assert after[("mlx_ring_requests_total", (("endpoint", "/metrics"), ("status", "200")))] == 1
    assert (
        after[("mlx_ring_completion_tokens_total", ())]
        == usage["completion_tokens"]
        == len(engine.answer_ids()) + 1
    )
    assert after[("mlx_ring_prompt_tokens_total", ())] == usage["prompt_tokens"]
    deltas = [len(ev.tokens) for ev in engine.emitted[0] if hasattr(ev, "tokens")]
    assert after[("mlx_ring_time_to_first_token_seconds_count", ())] == 1
    # each token after the first delta's
    assert after[("mlx_ring_inter_token_latency_seconds_count", ())] == sum(deltas[1:])
    # the engine's snapshot
    assert (
        after[("mlx_ring_up", ())] == 1
        and after[("mlx_ring_queue_depth", ())] == 0
        and after[("mlx_ring_active_sequences", ())] == 0
    )
    assert after[("mlx_ring_waiting_prompts", ())] == 0
    buckets = {
        dict(labels)["le"]: v
        for (name, labels), v in after.items()
        if name == "mlx_ring_step_seconds_bucket"
    }
    assert (
        buckets["0.001"] == 0
        and buckets["0.005"] == 3
        and buckets["0.01"] == 7
        and buckets["2.5"] == 7
    )
    assert (
        buckets["5.0"] == 8
        and buckets["+Inf"] == 10
        and after[("mlx_ring_step_seconds_count", ())] == 10
    )
    assert after[("mlx_ring_step_seconds_sum", ())] == 12.5
    assert (
        after[("mlx_ring_prompt_cache_hit_tokens", ())] == 120
        and after[("mlx_ring_prompt_cache_tokens", ())] == 300
    )
    assert ("mlx_ring_draft_tokens", ()) not in after  # no speculative decoding
    # every rank's live figures, labelled with its rank and host
    for rank, host in enumerate(HOSTS):
        row, who = rank_row(rank), (("host", host), ("rank", str(rank)))
        assert (
            after[("mlx_ring_rank_memory_bytes", (who[0], ("kind", "peak"), who[1]))]
            == row["mlx_peak_memory_kib"] * 1024
        )
        assert (
            after[("mlx_ring_rank_memory_bytes", (who[0], ("kind", "rss"), who[1]))]
            == row["rss_kib"] * 1024
        )
        assert after[("mlx_ring_rank_kv_cache_bytes", who)] == row["kv_cache_kib"] * 1024
        assert after[("mlx_ring_rank_stage_seconds", who)] == row["forward_us"] / 1e6
        assert after[("mlx_ring_rank_open_sequences", who)] == row["open_sequences"]
        assert after[("mlx_ring_rank_busy_seconds_total", who)] == row["busy_cs"] / 100
        assert after[("mlx_ring_rank_prompt_cache_bytes", who)] == row["prompt_cache_kib"] * 1024
        assert after[("mlx_ring_rank_prefill_tokens_total", who)] == row["prefill_tokens"]


def test_metrics_count_each_dialects_route_by_its_name(engine, served):
    with client(engine, served) as http:
        assert (
            http.post(
                "/v1/messages", json={"model": MODEL, "max_tokens": 4, "messages": HI}
            ).status_code
            == 200
        )
        assert (
            http.post(
                "/v1/responses", json={"model": MODEL, "input": "Hi", "max_output_tokens": 4}
            ).status_code
            == 200
        )
        assert http.get("/v1/responses/resp_nobody").status_code == 404
        assert (
            http.post(
                "/api/chat", json={"model": MODEL, "messages": HI, "stream": False}
            ).status_code
            == 200
        )
        # only loads the model
        assert http.post("/api/generate", json={"model": MODEL}).status_code == 200
        assert http.get("/v1/models/elsewhere").status_code == 404
        assert http.get("/no/such/route").status_code == 404
        m = scrape(http)
    counted = {
        (dict(labels)["endpoint"], dict(labels)["status"]): v
        for (name, labels), v in m.items()
        if name == "mlx_ring_requests_total"
    }
    assert counted == {
        ("/v1/messages", "200"): 1,
        ("/v1/responses", "200"): 1,
        ("/v1/responses/{response_id}", "404"): 1,
        ("/api/chat", "200"): 1,
        ("/api/generate", "200"): 1,
        ("/v1/models/{model_id}", "404"): 1,
        ("other", "404"): 1,
    }


def test_draft_figures_show_with_speculative_decoding(engine, served):
    engine.snapshot = replace(engine.snapshot, draft_tokens=4, drafted=40, accepted=31)
    with client(engine, served) as http:
        m = scrape(http)
    assert (
        m[("mlx_ring_draft_tokens", ())] == 40 and m[("mlx_ring_draft_tokens_accepted", ())] == 31
    )


def test_prompts_prefilling_now_show_their_progress_in_status_and_metrics(engine, served):
    with client(engine, served) as http:
        assert http.get("/cluster/status").json()["prefilling"] == []
        m = scrape(http)
        assert m[("mlx_ring_prefilling_prompts", ())] == 0
        assert m[("mlx_ring_prefill_tokens", ())] == m[("mlx_ring_prefill_done_tokens", ())] == 0
        engine.snapshot = replace(
            engine.snapshot,
            prefills=(PrefillProgress(120_000, 45_056, 40_000), PrefillProgress(900, 512, 0)),
        )
        assert http.get("/cluster/status").json()["prefilling"] == [
            {"tokens": 120_000, "done": 45_056, "cached": 40_000},
            {"tokens": 900, "done": 512, "cached": 0},
        ]
        m = scrape(http)
    assert m[("mlx_ring_prefilling_prompts", ())] == 2
    assert (m[("mlx_ring_prefill_tokens", ())], m[("mlx_ring_prefill_done_tokens", ())]) == (
        120_900,
        45_568,
    )


def test_a_failed_over_ring_says_so_in_health_status_and_metrics(engine, served, monkeypatch):
    from mlx_ring.config import parse_config

    away = {"hosts": ["mac3"], "since": 1764000000, "why": "mac3 did not answer ssh for 120 s"}
    monkeypatch.setenv("RING_AWAY", json.dumps(away))
    cfg = parse_config([])[0]
    assert cfg.away == away
    monkeypatch.setenv("RING_AWAY", "mac3")
    with pytest.raises(ValueError, match="RING_AWAY='mac3' must be JSON"):
        parse_config([])
    with client(engine, served, app_args={"away": cfg.away}) as http:
        r = http.get("/health")
        assert (
            r.status_code == 200 and r.json()["status"] == "ok" and r.json()["failed_over"] == away
        )
        assert http.get("/cluster/status").json()["failed_over"] == away
        m = scrape(http)
        assert (
            m[("mlx_ring_hosts_away", ())] == 1
            and m[("mlx_ring_failed_over_since_seconds", ())] == 1764000000
        )
    with client(engine, served) as http:  # serving on every host: nothing said
        assert (
            "failed_over" not in http.get("/health").json()
            and "failed_over" not in http.get("/cluster/status").json()
        )
        m = scrape(http)
        assert (
            m[("mlx_ring_hosts_away", ())] == 0
            and ("mlx_ring_failed_over_since_seconds", ()) not in m
        )
