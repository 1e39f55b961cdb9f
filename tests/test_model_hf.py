"""``model=hf``: a local Hugging Face causal LM in federated training (fedpriv.models.hf), fully
fine-tuned or through LoRA adapters, on model directories the tests write (nothing downloaded)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from tests.warm_launcher import run_module

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from fedpriv.clipping import UnsupportedLayerError  # noqa: E402
from fedpriv.errors import ConfigError  # noqa: E402
from fedpriv.metrics import sequence_token_losses  # noqa: E402
from fedpriv.models import get_flat_params  # noqa: E402
from fedpriv.models.hf import HFCausalLM  # noqa: E402
from fedpriv.models.tiny_hf import write_model_dir  # noqa: E402
from tests.conftest import compose_cfg  # noqa: E402
from tests.test_clipping import MODES, one_thread  # noqa: E402, F401 (a module fixture: one torch thread)
from tests.test_clipping_hf import check_against_loop  # noqa: E402
from tests.test_hf_teacher import make_hf_dir  # noqa: E402

WORDS = tuple(f"w{i}" for i in range(1, 301))  # the smoke experiment's words
pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return write_model_dir(tmp_path_factory.mktemp("hf") / "llama", WORDS, "llama", hidden=32, layers=2, heads=4)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """GPT-2 style: no pad token, so the data's vocabulary is the model's rows plus an appended pad."""
    return make_hf_dir(tmp_path_factory.mktemp("hf") / "gpt2", gpt2_style=True)


@pytest.fixture(scope="module")
def opt_dir(tmp_path_factory):
    """OPT: learned positions computed from the attention mask, which per-sample clipping refuses."""
    from fedpriv.models.tiny_hf import word_tokenizer

    path = tmp_path_factory.mktemp("hf") / "opt"
    tok = word_tokenizer(WORDS)
    config = transformers.OPTConfig(vocab_size=len(tok), hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                    num_attention_heads=4, word_embed_proj_dim=32, max_position_embeddings=128,
                                    pad_token_id=0, bos_token_id=len(tok) - 2, eos_token_id=len(tok) - 1)
    torch.manual_seed(0)
    tok.save_pretrained(path)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path, safe_serialization=True)
    return path


def hf_args(path, *extra: str) -> tuple[str, ...]:
    return ("+experiment=smoke", "progress=false", "model=hf", f"model.path={path}", "data.tokenizer=hf", *extra)


def run(tmp_path, *overrides: str, name: str = "r"):
    from fedpriv.runner import prepare
    from server.app import run_local

    session = prepare(compose_cfg(*overrides, run_dir=tmp_path / name))
    return session, run_local(session)


def per_row_loss(pad_id: int, flat: bool = False):
    """The production loss of a one-pass round: each row's mean token loss (sequence_token_losses)."""
    def loss(model: nn.Module, rows: torch.Tensor) -> torch.Tensor:
        ce, count = sequence_token_losses(model, rows, pad_id, flat=flat)
        return ce / count.clamp(min=1)
    return loss


def rows_of(vocab: int, pad: int, b: int = 5, t: int = 9, seed: int = 0) -> torch.Tensor:
    """[B, T+1] rows of random ids, each row ending in pads after a different length."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, min(vocab, 200), (b, t + 1), generator=g)
    for i in range(b):
        x[i, t + 1 - i:] = pad
    return x


# ----------------------------------------------------------------------------- the wrapper


def test_the_wrapper_equals_the_model_and_never_predicts_the_appended_pad(gpt2_dir):
    lm = transformers.AutoModelForCausalLM.from_pretrained(str(gpt2_dir), local_files_only=True)
    rows = lm.get_input_embeddings().num_embeddings
    model = HFCausalLM.load(gpt2_dir, vocab_size=rows + 1, pad_id=rows)
    assert model.split  # the last hidden state and lm_head reproduce the model's logits
    x = torch.tensor([[0, 5, 6, 7, rows, rows]])  # BOS w w w PAD PAD (the pad has no model row)
    logits = model(x)
    assert logits.shape == (1, 6, rows + 1) and torch.isinf(logits[..., rows]).all()
    torch.testing.assert_close(logits[0, :4, :rows], lm(input_ids=x[:, :4]).logits[0], rtol=1e-5, atol=1e-5)
    keep = torch.tensor([[True, True, False, True, False, False]])
    torch.testing.assert_close(model(x, keep=keep), logits[keep])
    with pytest.raises(ConfigError, match="more than an appended pad"):
        HFCausalLM.load(gpt2_dir, vocab_size=rows + 2, pad_id=rows)


def test_a_tokenizer_far_smaller_than_the_embedding_table_is_refused():
    """Rows padded for speed (a few percent) are fine; a tokenizer of under 90% of the rows is
    another model's (issue 52, item 6)."""
    from fedpriv.models.tiny_hf import tiny_config

    def lm(rows: int):
        return transformers.AutoModelForCausalLM.from_config(tiny_config("llama", rows, hidden=16, layers=1, heads=2))

    with pytest.raises(ConfigError, match="1000 token embeddings but the tokenizer only 304 ids"):
        HFCausalLM(lm(1000), vocab_size=len(WORDS) + 4, pad_id=0)
    assert HFCausalLM(lm(320), vocab_size=len(WORDS) + 4, pad_id=0).vocab_size == 304  # 95%: padded rows


def test_a_head_the_split_does_not_reproduce_keeps_the_whole_forward(llama_dir):
    class Scaled(transformers.LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 2.0
            return out

    lm = Scaled.from_pretrained(str(llama_dir), local_files_only=True)
    model = HFCausalLM(lm, vocab_size=len(WORDS) + 4, pad_id=0)
    assert not model.split
    x = torch.randint(1, 300, (2, 7))
    torch.testing.assert_close(model(x), lm(input_ids=x).logits)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("lora", [0, 4], ids=["full", "lora"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_book_keeping_on_the_wrapper_equals_the_per_sample_loop(family, lora, mode, llama_dir, gpt2_dir):
    """The clipped sum of a one-pass round's per-row losses on model=hf, LoRA or full, tied GPT-2
    embeddings with an appended pad or Llama, equals the per-sample autograd loop (1e-4)."""
    path = llama_dir if family == "llama" else gpt2_dir
    rows = 304 if family == "llama" else 302
    vocab, pad = (rows, 0) if family == "llama" else (rows + 1, rows)
    torch.manual_seed(1)
    model = HFCausalLM.load(path, vocab, pad, lora_rank=lora)
    if lora:  # lora_B starts at zero (no gradient reaches lora_A): give both factors a gradient
        with torch.no_grad():
            for name, p in model.named_parameters():
                if ".lora_B." in name:
                    p.normal_(0, 0.1)
    data = (rows_of(vocab, pad, seed=3),)
    check_against_loop(model, per_row_loss(pad), data, mode)
    if family == "gpt2" and not lora:  # a trainable tied embedding: the head cannot run on flattened positions
        with pytest.raises(UnsupportedLayerError, match="tied"):
            check_against_loop(model, per_row_loss(pad, flat=True), data, mode)
    else:
        check_against_loop(model, per_row_loss(pad, flat=True), data, mode)


@pytest.mark.parametrize("mode", MODES)
def test_lora_on_opt_equals_the_per_sample_loop(mode, opt_dir):
    """OPT's learned positions are refused when trainable; LoRA freezes them, and Book-Keeping on the
    adapters equals the per-sample loop (what docs/HF_MODELS.md offers as what runs)."""
    torch.manual_seed(1)
    model = HFCausalLM.load(opt_dir, len(WORDS) + 4, 0, lora_rank=4, lora_targets=["q_proj", "v_proj"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.1)
    data = (rows_of(len(WORDS) + 4, 0, seed=3),)
    check_against_loop(model, per_row_loss(0), data, mode)
    check_against_loop(model, per_row_loss(0, flat=True), data, mode)


# ----------------------------------------------------------------------------- runs


def test_the_issue_command_trains_and_releases_a_hugging_face_directory(llama_dir, tmp_path, run_cli):
    """`python -m fedpriv.simulate +experiment=smoke model=hf model.path=DIR model.lora_rank=4
    data.tokenizer=hf`: the released directory loads with transformers (merged) and peft (adapter)
    and computes the released parameters' function."""
    out = run_cli("+experiment=smoke", "model=hf", f"model.path={llama_dir}", "model.lora_rank=4",
                  "data.tokenizer=hf", f"run_dir={tmp_path / 'r'}")
    assert out.returncode == 0, out.stderr
    assert "user-level epsilon" in out.stdout and "Loading weights" not in out.stderr + out.stdout
    run_dir = tmp_path / "r"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["release"] == "hf_model"
    config = (run_dir / "config.yaml").read_text()
    assert f"tokenizer_path: {llama_dir}" in config  # data.tokenizer_path defaulted to model.path
    released = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=False)["server"]
    params = released["ema"] if released.get("ema") is not None else released["params"]
    vocab = len(WORDS) + 4
    mine = HFCausalLM.load(llama_dir, vocab, 0, lora_rank=4)
    from fedpriv.models import set_flat_params

    set_flat_params(mine, params)
    x = torch.randint(1, 300, (3, 8))
    with torch.no_grad():
        want = mine(x)
        merged = transformers.AutoModelForCausalLM.from_pretrained(str(run_dir / "hf_model"), local_files_only=True)
        torch.testing.assert_close(merged(input_ids=x).logits, want, rtol=1e-5, atol=1e-5)
        base = transformers.AutoModelForCausalLM.from_pretrained(str(llama_dir), local_files_only=True)
        adapted = peft.PeftModel.from_pretrained(base, str(run_dir / "hf_model" / "adapter"))
        torch.testing.assert_close(adapted(input_ids=x).logits, want, rtol=1e-5, atol=1e-5)
    tok = transformers.AutoTokenizer.from_pretrained(str(run_dir / "hf_model"), local_files_only=True)
    assert tok.convert_tokens_to_ids("w7") == 7
    assert not list(run_dir.glob(".hf_model*"))  # no temporary directory left
    card = (run_dir / "hf_model" / "README.md").read_text()  # the release carries the claim and the mode
    assert "user-level epsilon 50 at delta 0.001" in card and "research mode" in card


@pytest.mark.parametrize("typed", ["absolute", "relative"])
def test_the_released_adapter_loads_the_standard_ways_from_anywhere(typed, llama_dir, tmp_path, monkeypatch):
    """Issue 41, edge 4 and L4: the adapter's config says CAUSAL_LM and names the base by its own
    name (not the absolute or cwd-relative path typed), as does the model card; the release is
    readable by others (0644/0755 under umask 022); peft's AutoPeftModelForCausalLM loads it from
    another directory that holds the base under that name, and computes the merged release."""
    import os
    import shutil

    path = str(llama_dir)
    if typed == "relative":
        monkeypatch.chdir(llama_dir.parent.parent)
        path = f"{llama_dir.parent.name}/{llama_dir.name}"  # what the user typed, relative to their cwd
    previous = os.umask(0o022)
    try:
        run(tmp_path, *hf_args(path, "model.lora_rank=2", "rounds=1"))
    finally:
        os.umask(previous)
    release = tmp_path / "r" / "hf_model"
    config = json.loads((release / "adapter" / "adapter_config.json").read_text())
    assert config["task_type"] == "CAUSAL_LM" and config["base_model_name_or_path"] == "llama"
    card = (release / "README.md").read_text()
    assert "Fine-tuned from `llama` " in card and str(llama_dir) not in card
    for item in [release, *release.rglob("*")]:
        assert item.stat().st_mode & 0o777 == (0o755 if item.is_dir() else 0o644), item
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(llama_dir, elsewhere / "llama")
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    x = torch.randint(1, 300, (3, 8))
    with torch.no_grad():
        merged = transformers.AutoModelForCausalLM.from_pretrained(str(release), local_files_only=True)
        adapted = peft.AutoPeftModelForCausalLM.from_pretrained(str(release / "adapter"), local_files_only=True)
        torch.testing.assert_close(adapted(input_ids=x).logits, merged(input_ids=x).logits, rtol=1e-5, atol=1e-5)


def test_the_base_model_is_named_by_its_hub_id_its_cache_entry_or_its_directory(tmp_path):
    """L4: a config's `_name_or_path` that is a hub id (namespace/name) names the base; a local path
    there is not used; a Hugging Face cache snapshot is named by its repository; else the directory."""
    from fedpriv.models.hf import base_model_name

    def base(where, name_or_path=None):
        where.mkdir(parents=True)
        extra = {} if name_or_path is None else {"_name_or_path": name_or_path}
        (where / "config.json").write_text(json.dumps({"model_type": "llama", **extra}))
        return base_model_name(where)

    assert base(tmp_path / "a" / "mine", "acme/tiny-llama") == "acme/tiny-llama"
    assert base(tmp_path / "b" / "mine", "/home/someone/checkpoints/llama") == "mine"
    assert base(tmp_path / "c" / "mine", "../llama") == "mine"
    assert base(tmp_path / "d" / "mine") == "mine"
    assert base(tmp_path / "models--acme--tiny-opt" / "snapshots" / "0123abcd") == "acme/tiny-opt"


def test_with_lora_only_adapters_are_trained_noised_and_sent(llama_dir, tmp_path):
    """The flat parameter vector (what the server noises and releases and the codec sends) is the
    adapters; base weights stay bit-identical; through the Flower message path the replies carry
    adapter-sized deltas only."""
    from client.app import make_client_app
    from fedpriv.runner import prepare
    from server.app import grid_round_fn
    from server.grid import LocalGrid

    cfg = compose_cfg(*hf_args(llama_dir, "model.lora_rank=2", "model.lora_targets=[q_proj,v_proj]"),
                      run_dir=tmp_path / "r")
    session = prepare(cfg)
    model = session.task.client_model
    adapters = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert adapters and all(".lora_A." in n or ".lora_B." in n for n in adapters)
    assert {n.split(".")[-4] for n in adapters} == {"q_proj", "v_proj"}
    dim = sum(p.numel() for p in adapters.values())
    assert session.server.params.numel() == dim == 2 * 2 * (2 * 32 + 32 + 16)  # 2 layers, q (32->32), v (32->16)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    sizes: list[int] = []
    inner = make_client_app(cfg)
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def train(msg, context):
        assert msg.content["arrays"]["params"].shape == (dim,)
        reply = inner(msg, context)
        sizes.extend(a.shape[0] for a in reply.content.array_records["deltas"].values())
        return reply

    round_fn = grid_round_fn(LocalGrid(app, num_nodes=2), 2, None)
    server = session.server
    before = server.params.clone()
    cohort = server.cohort(0)
    server.apply_round(0, cohort, round_fn(server.round_inputs(0, cohort)), diagnostics=False)
    assert sizes and set(sizes) == {dim}
    assert not torch.equal(server.params, before)
    for n, p in model.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, base[n]), n
    assert session.ledger.dimension == dim  # the noise-scale line and privacy.json count the adapters


@pytest.mark.parametrize("extra", [
    ("algorithm=dp_fedsgd", "algorithm.one_pass=true"),
    ("algorithm=dpsgd",),
    ("client.dp=example",),
    ("mechanism=tree",),
    ("mechanism=bandmf",),
    ("mechanism=blt",),
    ("privacy.clipping=adaptive",),
    ("audit.canaries=4",),
], ids=lambda e: e[0].split("=")[-1] if len(e) == 1 else "one_pass")
def test_lora_runs_under_every_algorithm_mechanism_and_option(extra, llama_dir, tmp_path):
    session, summary = run(tmp_path, *hf_args(llama_dir, "model.lora_rank=2", "rounds=2", *extra))
    assert torch.isfinite(session.server.params).all()
    assert summary["final"]["loss"] == summary["final"]["loss"] and summary["release"] == "hf_model"
    assert summary["privacy"]["epsilon"] is not None and summary["privacy"]["epsilon"] <= 50.0 + 1e-6
    assert session.server.params.numel() == sum(
        p.numel() for p in session.task.client_model.parameters() if p.requires_grad)


def test_full_fine_tuning_of_tied_gpt2_trains_every_weight(gpt2_dir, tmp_path):
    session, summary = run(tmp_path, *hf_args(gpt2_dir, "rounds=2"))
    total = sum(p.numel() for p in session.task.client_model.lm.parameters())
    assert session.server.params.numel() == total  # wte and lm_head are one (tied) parameter
    assert not torch.equal(session.server.params, get_flat_params(
        HFCausalLM.load(gpt2_dir, session.task.data.vocab.size, session.task.data.vocab.pad_id)))
    assert (tmp_path / "r" / "hf_model" / "model.safetensors").exists()
    assert not (tmp_path / "r" / "hf_model" / "adapter").exists()


def test_a_resumed_lora_run_equals_the_uninterrupted_one(llama_dir, tmp_path):
    from server.app import run_local
    from tests.helpers import interrupt_and_resume

    over = hf_args(llama_dir, "model.lora_rank=2", "rounds=3")
    whole, _ = run(tmp_path, *over, name="w")
    _, resumed = interrupt_and_resume(compose_cfg(*over, run_dir=tmp_path / "p"), 1)
    assert resumed.start_round == 1
    run_local(resumed)
    torch.testing.assert_close(resumed.server.params, whole.server.params, rtol=0, atol=0)
    a, b = (json.loads((tmp_path / d / "summary.json").read_text())["final"] for d in ("w", "p"))
    assert a == b


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("extra, message", [
    (("model=hf", "data.tokenizer=hf"), "model.path is required"),
    (("model=hf", "model.path=/nonexistent/dir", "data.tokenizer=hf"), "model.path must be a local directory holding"),
    (("model=hf", "model.path=DIR"), "add data.tokenizer=hf"),
    (("model=hf", "model.path=DIR", "data.tokenizer=hf", "client.parallel=2"), "client.parallel=2"),
    (("model=hf", "model.path=DIR", "data.tokenizer=hf", "model.lora_rank=2", "model.lora_targets=[nope]"),
     "LoRA target 'nope' matches no module"),
    (("model=hf", "model.path=DIR", "data.tokenizer=hf", "model.lora_targets=[q_proj]"), "apply to LoRA only"),
    (("model=hf", "model.path=DIR", "data.tokenizer=hf", "model.lora_rank=2", "model.lora_targets=q_proj"),
     "model.lora_targets must be a list"),
], ids=["no_path", "missing_dir", "word_tokenizer", "parallel", "bad_target", "targets_without_rank", "not_a_list"])
def test_bad_model_hf_input_is_one_error_line(extra, message, llama_dir, tmp_path):
    from fedpriv.runner import prepare

    extra = tuple(e.replace("DIR", str(llama_dir)) for e in extra)
    with pytest.raises(ConfigError, match=message):
        prepare(compose_cfg("+experiment=smoke", "progress=false", *extra, run_dir=tmp_path / "r"))
    assert not (tmp_path / "r").exists()


PER_SAMPLE = ("client.dp=example", "algorithm=dp_fedsgd", "algorithm=dpsgd")


@pytest.mark.parametrize("setting", PER_SAMPLE)
def test_a_family_per_sample_clipping_refuses_is_refused_on_every_per_sample_path_saying_what_works(
        setting, opt_dir, tmp_path):
    """Issue 41, edge 1: OPT under client.dp=example, one-pass dp_fedsgd and central dpsgd is refused
    by the same check before the run directory is made; the text names the family as unsupported
    under per-sample clipping and what does run."""
    from fedpriv.runner import prepare

    with pytest.raises(ConfigError) as err:
        prepare(compose_cfg(*hf_args(opt_dir, setting), run_dir=tmp_path / "r"))
    text = str(err.value)
    assert "\n" not in text and "the Hugging Face family 'opt' is not supported under per-sample clipping" in text
    assert "embed_positions (OPTLearnedPositionalEmbedding)" in text
    assert all(s in text for s in PER_SAMPLE) and "register a rule" not in text
    assert "algorithm=dp_fedavg with client.dp=none" in text and "model.lora_rank" in text
    assert not (tmp_path / "r").exists()


def test_dp_fedsgd_without_its_one_pass_round_is_not_refused(opt_dir, tmp_path):
    """The one-pass round is backend=local's; under Flower's engine dp_fedsgd's clients take a plain
    step each and the server clips whole deltas, so OPT passes the checks there."""
    from fedpriv.plan import preflight

    preflight(compose_cfg(*hf_args(opt_dir, "algorithm=dp_fedsgd", "backend=flower"), run_dir=tmp_path / "r"))
    with pytest.raises(ConfigError, match="algorithm=dp_fedsgd clips per sample"):
        preflight(compose_cfg(*hf_args(opt_dir, "algorithm=dp_fedsgd"), run_dir=tmp_path / "r"))


@pytest.mark.parametrize("algorithm, fixed", [
    ("dp_fedsgd", ("algorithm=dp_fedavg",)),
    ("dpsgd", ("algorithm=dpsgd", "model.lora_rank=2", "model.lora_targets=[q_proj,v_proj]")),
])
def test_the_one_pass_and_central_refusals_are_one_line_exit_2_and_a_fixed_rerun_works(
        algorithm, fixed, opt_dir, tmp_path, run_cli):
    """Issue 41, edge 1: through the CLI, one `error:` line and exit code 2 before anything is written
    (no config.yaml, metrics.jsonl or privacy.json left to make a fixed re-run ask for resume=true);
    the fix the message names then runs into the same directory."""
    out = run_cli("+experiment=smoke", "progress=false", "model=hf", f"model.path={opt_dir}", "data.tokenizer=hf",
                  f"algorithm={algorithm}", f"run_dir={tmp_path / 'r'}")
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "not supported under per-sample" in lines[0]
    assert not (tmp_path / "r").exists()
    _, summary = run(tmp_path, *hf_args(opt_dir, "rounds=1", *fixed))
    assert summary["final"]["loss"] == summary["final"]["loss"]
    assert (tmp_path / "r" / "privacy.json").exists()


def test_make_hf_and_pretrain_hf_write_a_directory_model_hf_loads(tmp_path):
    """docs/HF_MODELS.md's `python -m fedpriv.make_hf DIR` and scripts/pretrain_hf.py (issue 29's
    experiment, two public steps here): both write a model directory HFCausalLM loads."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    made = run_module("fedpriv.make_hf", str(tmp_path / "m"), "--hidden", "16", "--heads", "2", cwd=ROOT,
                      timeout=120)
    assert made.returncode == 0 and "wrote a random-init llama model (304 token ids)" in made.stdout, made.stderr
    again = run_module("fedpriv.make_hf", str(tmp_path / "m"), cwd=ROOT, timeout=120)
    assert again.returncode == 2 and again.stderr.startswith("error: ") and "not empty" in again.stderr
    pre = subprocess.run([sys.executable, "scripts/pretrain_hf.py", str(tmp_path / "p"), "--steps", "2",
                          "--hidden", "16", "--heads", "2", "+experiment=smoke"], cwd=ROOT, capture_output=True,
                         text=True, timeout=180)
    assert pre.returncode == 0 and "2 steps" in pre.stdout, pre.stderr
    for directory in (tmp_path / "m", tmp_path / "p"):
        model = HFCausalLM.load(directory, len(WORDS) + 4, 0)
        assert model(torch.randint(1, 300, (2, 5))).shape == (2, 5, len(WORDS) + 4)
