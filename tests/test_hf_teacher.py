"""public.teacher=hf: a local Hugging Face causal LM and its tokenizer (built here; nothing downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # noqa: E402

from fedpriv.public.hf import HFTeacher  # noqa: E402
from fedpriv.text.hf_tokenizer import HFTokenizer  # noqa: E402
from fedpriv.text.tokenizers import UNKNOWN_WORD, encode_rows  # noqa: E402

WORDS = " ".join(f"w{i}" for i in range(1, 301))  # the smoke experiment's synthetic words


def make_hf_dir(path: Path, gpt2_style: bool = False) -> Path:
    """A tiny GPT-2 and a word-level fast tokenizer; ``gpt2_style``: no pad, BOS = EOS = unk-less endoftext."""
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["<|endoftext|>", "[UNK]"] if gpt2_style else ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]
    tok.train_from_iterator([WORDS], trainers.WordLevelTrainer(special_tokens=specials))
    names = ({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "[UNK]"} if gpt2_style else
             {"pad_token": "[PAD]", "bos_token": "[BOS]", "eos_token": "[EOS]", "unk_token": "[UNK]"})
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **names)
    fast.save_pretrained(path)
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=len(fast), n_positions=64, n_embd=16, n_layer=1, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return make_hf_dir(tmp_path_factory.mktemp("hf") / "teacher")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    return make_hf_dir(tmp_path_factory.mktemp("hf") / "gpt2", gpt2_style=True)


def test_tokenizer_layout_with_a_pad_token(hf_dir):
    tok = HFTokenizer.load(hf_dir)
    assert (tok.pad_id, tok.oov_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
    assert tok.size == tok.teacher_size == 304
    assert tok.encode_word(UNKNOWN_WORD) == [1] and len(tok.encode_word("w5")) == 1


def test_gpt2_style_tokenizer_gets_an_appended_pad(gpt2_dir):
    tok = HFTokenizer.load(gpt2_dir)
    assert tok.pad_id == tok.teacher_size == 302 and tok.size == 303
    assert tok.bos_id == tok.eos_id == 0
    rows, _ = encode_rows(tok, ["w1 w2", "w3"], 5)
    assert rows[1].tolist() == [0, tok.encode_word("w3")[0], 0, 302, 302, 302]


def test_teacher_logits_ignore_right_padding_and_never_predict_the_pad(gpt2_dir):
    tok = HFTokenizer.load(gpt2_dir)
    teacher = HFTeacher.load(gpt2_dir, tok)
    rows, _ = encode_rows(tok, ["w1 w2 w3", "w4"], 6)
    x = torch.as_tensor(rows[:, :-1])
    logits = teacher(x)
    assert logits.shape == (2, 6, 303) and torch.isinf(logits[..., 302]).all()
    direct = teacher.model(input_ids=x[1:, :3]).logits  # the unpadded prefix BOS w4 EOS
    torch.testing.assert_close(logits[1, :3, :302], direct[0], rtol=1e-5, atol=1e-5)


def test_teacher_with_a_mismatched_tokenizer_is_refused(hf_dir, gpt2_dir, tmp_path):
    from fedpriv.errors import ConfigError

    small = tmp_path / "small"
    make_hf_dir(small)
    big_tok = HFTokenizer.load(hf_dir)
    big_tok.teacher_size = 10_000  # a tokenizer far larger than the model's embedding table
    with pytest.raises(ConfigError, match="token embeddings"):
        HFTeacher.load(small, big_tok)
    with pytest.raises(ConfigError, match="local directory"):
        HFTokenizer.load(tmp_path / "missing")


def test_a_directory_without_tokenizer_files_is_refused_not_an_empty_tokenizer(gpt2_dir, tmp_path):
    """transformers builds a GPT-2 tokenizer of one id from config.json alone; every word would then
    encode to nothing and a run would train to a loss near 0 (issue 52, item 6)."""
    from fedpriv.errors import ConfigError

    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_bytes((gpt2_dir / "config.json").read_bytes())
    with pytest.raises(ConfigError, match="holds no tokenizer files"):
        HFTokenizer.load(bare)


def test_a_tokenizer_of_special_tokens_only_is_refused(tmp_path):
    from fedpriv.errors import ConfigError

    tok = Tokenizer(models.WordLevel(vocab={"[PAD]": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]").save_pretrained(
        tmp_path / "specials")
    with pytest.raises(ConfigError, match="no token but its 2 special one"):
        HFTokenizer.load(tmp_path / "specials")


def test_a_teacher_whose_tokenizer_is_far_smaller_than_its_embeddings_is_refused(hf_dir, tmp_path):
    from fedpriv.errors import ConfigError

    tok = HFTokenizer.load(hf_dir)  # 304 ids
    wide = tmp_path / "wide"
    transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=1000, n_positions=64, n_embd=16, n_layer=1,
                                                         n_head=2)).save_pretrained(wide)
    with pytest.raises(ConfigError, match="another model's tokenizer"):
        HFTeacher.load(wide, tok)


def test_hf_teacher_distillation_end_to_end(run_cli, hf_dir, tmp_path):
    proc = run_cli("+experiment=smoke", "rounds=2", "eval_every=2", "progress=false", "data.tokenizer=hf",
                   "public.teacher=hf", f"public.teacher_path={hf_dir}", "public.pretrain_steps=3",
                   "public.distill_k=3", f"run_dir={tmp_path / 'r'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["public"]["distill_k"] == 3 and "word_accuracy" in summary["final"]
    assert "final next-word accuracy" in proc.stdout


def test_hf_teacher_needs_the_teachers_tokenizer(run_cli, hf_dir, tmp_path):
    proc = run_cli("+experiment=smoke", "public.teacher=hf", f"public.teacher_path={hf_dir}",
                   "public.pretrain_steps=2", f"run_dir={tmp_path / 'r'}")
    assert proc.returncode == 2 and "data.tokenizer=hf" in proc.stderr
    assert not (tmp_path / "r").exists()
