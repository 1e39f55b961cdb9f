"""A user-keyed synthetic corpus with a known generative model (the embedded default dataset).

Generative model
----------------
* Vocabulary: ``V`` words with Zipf base frequencies ``p(w) ∝ w^-s`` (id 1 is the most frequent).
  Token ids follow the StackOverflow layout: pad 0, words ``1..V``, OOV ``V+1`` (reserved, never
  generated), BOS ``V+2``, EOS ``V+3``.
* Topics: ``K`` private topics (ids ``0..K-1``) and ``P`` public-only topics (ids ``K..K+P-1``).
  Each topic is a sparse first-order Markov chain over the states ``{BOS} ∪ words``. A state ``s``
  has ``n_s`` word successors (uniform in ``[min_successors, max_successors]``, the same count in
  every topic): a share of them is common to all topics (drawn once from the Zipf distribution),
  the rest is topic-specific (drawn from the Zipf distribution restricted to the topic's word
  subset with probability ``topic_bias``, otherwise from the full Zipf distribution). Successor
  weights are ``Dirichlet(successor_concentration)`` per topic (optionally tilted toward frequent
  words by ``p(w)^zipf_weight_bias``), mixed as ``(1-ρ)·w + ρ·b`` with base weights ``b`` of the
  state's shared successors that every topic uses (``ρ = weight_sharing``): the shared part is
  what a single global model can learn, the rest is what topic inference from the prefix adds.
  A word state also ends the sentence (EOS) with a per-(topic, state) probability
  ``q ~ Beta(c, c·(mean_length-1))`` (mean ``1 / mean_length``); BOS never goes to EOS.
* Users: ``num_users`` users, user ``u`` has a topic mixture ``θ_u ~ Dirichlet(β·1_K)`` over the
  private topics and ``n_u`` sentences (lognormal, rounded, clipped to ``[1,
  max_sentences_per_user]``). Each sentence draws a topic from ``θ_u`` and then runs the chain
  from BOS until EOS or ``seq_len`` words (then the EOS is cut, as in TFF's preprocessing).
* Test set: ``num_test`` sentences; each picks a user with probability ``∝ n_u``, a topic from
  ``θ_u``, then runs the chain.
* Public corpus: ``num_public`` sentences from a shifted mixture: a fraction
  ``public_private_fraction`` (exactly, after rounding) is drawn uniformly from the private topics,
  the rest uniformly from the public-only topics; each carries its topic label.

The Bayes ceiling and the other reference accuracies of the generated dataset are computed from the
chains by its Bayes oracle, :mod:`fedpriv.data.synthetic_oracle`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
import dataclasses
import math
from typing import ClassVar, Literal

import numpy as np

from fedpriv.data.federated import FederatedDataset, PublicCorpus, Vocabulary
from fedpriv.data.synthetic_oracle import (TopicChains, bigram_bayes_accuracy, ceiling_accuracy,
                                           oracle_topic_accuracy, scored_positions, unigram_accuracy)
from fedpriv.errors import ConfigError
from fedpriv.schema import Section, TextPipeline, register_option


@dataclass(frozen=True)
class SyntheticConfig:
    """Every knob of the generator; the defaults are calibrated to StackOverflow-like difficulty."""

    seq_len: int = 20
    vocab_size: int = 3000  # words in the Zipf vocabulary
    num_topics: int = 20  # topics of the private users (each a Markov chain over words)
    num_public_topics: int = 10  # topics of the public corpus only (its domain shift)
    num_users: int = 10000  # training users: the population
    mean_sentences: float = 25.0  # mean sentences per user (lognormal, before rounding and clipping)
    sentences_sigma: float = 1.0  # lognormal shape of sentences per user
    max_sentences_per_user: int = 256  # cap on each user's sentences
    num_test: int = 4000  # test sentences (from held-out draws of the users)
    num_public: int = 20000  # public corpus sentences
    public_private_fraction: float = 0.2  # share of the public corpus drawn from the private topics
    zipf_exponent: float = 1.0
    user_concentration: float = 0.3  # Dirichlet β of the users' topic mixtures
    min_successors: int = 4
    max_successors: int = 10
    shared_successor_fraction: float = 0.5  # share of a state's successors common to all topics
    topic_words: int = 150  # size of each topic's word subset
    topic_bias: float = 0.7  # P(a topic-specific successor comes from the topic's subset)
    successor_concentration: float = 0.8  # Dirichlet α of successor weights
    zipf_weight_bias: float = 0.0  # weights ∝ Dirichlet · p(w)^bias (0: no tilt)
    weight_sharing: float = 0.12  # mix of a state's shared base weights into every topic's weights
    mean_length: float = 14.0  # mean words per sentence before truncation to seq_len
    eos_concentration: float = 4.0  # Beta(c, c·(mean_length-1)) for the EOS probability
    seed: int = 0


@dataclass(frozen=True)
class SyntheticTruth:
    """The hidden ground truth behind a generated dataset."""

    chains: TopicChains
    user_mixtures: np.ndarray  # float64 [U, K]
    user_topics: list[np.ndarray]  # user_topics[u]: int64 [n_u], topic of each sentence
    topic_prior: np.ndarray  # float64 [K], population topic distribution
    test_topics: np.ndarray  # int64 [M]
    test_users: np.ndarray  # int64 [M]


def make_vocabulary(vocab_size: int) -> Vocabulary:
    """Words ``w1..wV`` in the StackOverflow layout (:meth:`Vocabulary.of_words`)."""
    return Vocabulary.of_words([f"w{i}" for i in range(1, vocab_size + 1)])


def zipf_probs(vocab_size: int, exponent: float) -> np.ndarray:
    """Base word distribution ``p(w) ∝ w^-exponent`` over ids 1..V (index 0 is word 1)."""
    p = np.arange(1, vocab_size + 1, dtype=np.float64) ** -exponent
    return p / p.sum()


def _validate(cfg: SyntheticConfig, path: str = "synthetic") -> None:
    """Raise ``ConfigError`` on a config the generator cannot honour (the one validator of its
    knobs: ``data.synthetic`` is checked here too, its keys named under ``path``)."""
    checks = [
        (cfg.seq_len >= 1, "seq_len must be >= 1"),
        (cfg.vocab_size >= 2, "vocab_size must be >= 2"),
        (cfg.num_topics >= 1, "num_topics must be >= 1"),
        (cfg.num_public_topics >= 0, "num_public_topics must be >= 0"),
        (cfg.num_users >= 1, "num_users must be >= 1"),
        (cfg.max_sentences_per_user >= 1, "max_sentences_per_user must be >= 1"),
        (cfg.mean_sentences >= 1, "mean_sentences must be >= 1"),
        (cfg.sentences_sigma >= 0, "sentences_sigma must be >= 0"),
        (cfg.zipf_exponent >= 0, "zipf_exponent must be >= 0"),
        (cfg.zipf_weight_bias >= 0, "zipf_weight_bias must be >= 0"),
        (0.0 <= cfg.weight_sharing <= 1.0, "weight_sharing must be in [0, 1]"),
        (cfg.num_test >= 1, "num_test must be >= 1"),
        (cfg.num_public >= 0, "num_public must be >= 0"),
        (0.0 <= cfg.public_private_fraction <= 1.0, "public_private_fraction must be in [0, 1]"),
        (cfg.num_public_topics > 0 or cfg.public_private_fraction == 1.0 or cfg.num_public == 0,
         "num_public_topics must be >= 1 for public-only samples (public_private_fraction < 1)"),
        (1 <= cfg.min_successors <= cfg.max_successors <= cfg.vocab_size,
         "min_successors must satisfy 1 <= min_successors <= max_successors <= vocab_size"),
        (1 <= cfg.topic_words <= cfg.vocab_size, "topic_words must be in [1, vocab_size]"),
        (0.0 <= cfg.shared_successor_fraction <= 1.0, "shared_successor_fraction must be in [0, 1]"),
        (0.0 <= cfg.topic_bias <= 1.0, "topic_bias must be in [0, 1]"),
        (cfg.successor_concentration > 0, "successor_concentration must be > 0"),
        (cfg.user_concentration > 0, "user_concentration must be > 0"),
        (cfg.mean_length > 1, "mean_length must be > 1"),
        (cfg.eos_concentration > 0, "eos_concentration must be > 0"),
    ]
    for ok, msg in checks:
        if not ok:
            raise ConfigError(f"{path}.{msg}")


# ---------------------------------------------------------------------------------------------
# Chains


def _draw(rng: np.random.Generator, cdf: np.ndarray, size: tuple[int, ...]) -> np.ndarray:
    """Indices drawn i.i.d. from the distribution with cumulative sums ``cdf``."""
    idx = np.searchsorted(cdf, rng.random(size) * cdf[-1], side="right")
    return np.minimum(idx, len(cdf) - 1)


def _first_distinct(cands: np.ndarray, valid: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per row, the first ``counts[r]`` distinct valid candidates in column order (0 = padding).

    Returns int64 ``[R, counts.max()]``; a row with too few distinct candidates is zero-padded.
    """
    rows, cols = cands.shape
    order = np.argsort(cands * cols + np.arange(cols), axis=1, kind="stable")
    sorted_c = np.take_along_axis(cands, order, axis=1)
    first = np.ones_like(valid)
    first[:, 1:] = sorted_c[:, 1:] != sorted_c[:, :-1]
    keep = np.zeros_like(valid)
    np.put_along_axis(keep, order, first, axis=1)
    keep &= valid
    # Later (among valid, distinct) columns lose; rank them by column position.
    rank = np.where(keep, np.arange(cols), cols + 1)
    pick = np.argsort(rank, axis=1, kind="stable")[:, : counts.max()]
    out = np.take_along_axis(cands, pick, axis=1)
    ok = np.take_along_axis(keep, pick, axis=1) & (np.arange(pick.shape[1]) < counts[:, None])
    return np.where(ok, out, 0)


def _share_weights(w: np.ndarray, chosen: np.ndarray, shared: np.ndarray, shared_w: np.ndarray,
                   rho: float) -> np.ndarray:
    """``(1-ρ)·w + ρ·b`` where ``b`` are the state's shared base weights (on shared successors)."""
    match = (chosen[:, :, None] == shared[:, None, :]) & (chosen[:, :, None] > 0)
    b = (match * shared_w[:, None, :]).sum(axis=2)
    has = b.sum(axis=1, keepdims=True) > 0  # states without shared successors keep their weights
    return np.where(has, (1.0 - rho) * w + rho * b, w)


def build_chains(cfg: SyntheticConfig, rng: np.random.Generator) -> TopicChains:
    """Draw every topic's sparse Markov chain (see the module docstring)."""
    v, n_topics = cfg.vocab_size, cfg.num_topics + cfg.num_public_topics
    vocab = make_vocabulary(v)
    n_states, m_max = v + 1, cfg.max_successors
    base = zipf_probs(v, cfg.zipf_exponent)
    base_cdf = np.cumsum(base)

    counts = rng.integers(cfg.min_successors, cfg.max_successors + 1, size=n_states)
    n_shared = np.rint(counts * cfg.shared_successor_fraction).astype(np.int64)
    n_draw = 3 * m_max
    shared = _draw(rng, base_cdf, (n_states, n_draw)) + 1
    shared = _first_distinct(shared, np.ones(shared.shape, bool), n_shared)
    shared_w = np.where(shared > 0, rng.gamma(cfg.successor_concentration, size=shared.shape), 0)
    shared_w /= np.maximum(shared_w.sum(axis=1, keepdims=True), 1e-300)

    topic_words = np.stack([np.sort(rng.choice(v, cfg.topic_words, replace=False)) + 1
                            for _ in range(n_topics)])
    succ = np.zeros((n_topics, n_states, m_max + 1), dtype=np.int64)
    prob = np.zeros((n_topics, n_states, m_max + 1))
    for t in range(n_topics):
        words = topic_words[t]
        sub_cdf = np.cumsum(base[words - 1])
        from_topic = rng.random((n_states, n_draw)) < cfg.topic_bias
        own = words[_draw(rng, sub_cdf, (n_states, n_draw))]
        other = _draw(rng, base_cdf, (n_states, n_draw)) + 1
        cands = np.concatenate([shared, np.where(from_topic, own, other)], axis=1)
        chosen = _first_distinct(cands, cands > 0, counts)  # [S, <= m_max]
        k = chosen.shape[1]
        w = rng.gamma(cfg.successor_concentration, size=chosen.shape)
        if cfg.zipf_weight_bias:
            w = w * base[np.maximum(chosen, 1) - 1] ** cfg.zipf_weight_bias
        w = np.where(chosen > 0, w, 0.0)
        w /= w.sum(axis=1, keepdims=True)
        if cfg.weight_sharing:
            w = _share_weights(w, chosen, shared, shared_w, cfg.weight_sharing)
        a = cfg.eos_concentration
        q = rng.beta(a, a * (cfg.mean_length - 1.0), size=n_states)
        q[0] = 0.0  # BOS never ends the sentence
        succ[t, :, :k] = chosen
        prob[t, :, :k] = w * (1.0 - q)[:, None]
        succ[t, :, m_max] = np.where(q > 0, vocab.eos_id, 0)
        prob[t, :, m_max] = q
    return TopicChains(succ=succ, prob=prob, topic_words=topic_words, vocab=vocab)


# ---------------------------------------------------------------------------------------------
# Sentences


def sample_sentences(chains: TopicChains, topics: np.ndarray, seq_len: int,
                     rng: np.random.Generator) -> np.ndarray:
    """Run each sentence's topic chain from BOS; rows ``[BOS, w.., EOS, 0..]`` of ``seq_len+1``."""
    vocab = chains.vocab
    n = len(topics)
    rows = np.zeros((n, seq_len + 1), dtype=np.int64)
    rows[:, 0] = vocab.bos_id
    cdf = np.cumsum(chains.prob, axis=2)
    cdf /= cdf[:, :, -1:]
    state = np.zeros(n, dtype=np.int64)
    alive = np.arange(n)
    for i in range(1, seq_len + 1):
        if alive.size == 0:
            break
        c = cdf[topics[alive], state[alive]]
        j = (rng.random(alive.size)[:, None] >= c).sum(axis=1)
        j = np.minimum(j, c.shape[1] - 1)
        tok = chains.succ[topics[alive], state[alive], j]
        rows[alive, i] = tok
        going = tok != vocab.eos_id
        alive = alive[going]
        state[alive] = tok[going]
    return rows


def user_sentence_counts(cfg: SyntheticConfig, rng: np.random.Generator) -> np.ndarray:
    """Heavy-tailed sentences per user: lognormal, rounded, clipped to [1, max]."""
    sigma = cfg.sentences_sigma
    mu = math.log(cfg.mean_sentences) - sigma**2 / 2
    n = np.rint(rng.lognormal(mu, sigma, size=cfg.num_users)).astype(np.int64)
    return np.clip(n, 1, cfg.max_sentences_per_user)


def _draw_topics(mixtures: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One topic per row of ``mixtures`` (each row a distribution)."""
    cdf = np.cumsum(mixtures, axis=1)
    j = (rng.random(len(mixtures))[:, None] * cdf[:, -1:] >= cdf).sum(axis=1)
    return np.minimum(j, mixtures.shape[1] - 1)


def public_topics(cfg: SyntheticConfig, rng: np.random.Generator) -> np.ndarray:
    """Shifted mixture: exactly ``round(fraction·P)`` private-topic samples, the rest public-only."""
    n_priv = int(round(cfg.public_private_fraction * cfg.num_public))
    priv = rng.integers(0, cfg.num_topics, size=n_priv)
    pub = cfg.num_topics + rng.integers(0, max(cfg.num_public_topics, 1),
                                        size=cfg.num_public - n_priv)
    return rng.permutation(np.concatenate([priv, pub]).astype(np.int64))


# ---------------------------------------------------------------------------------------------
# Assembly

REFERENCE_SOURCE = ("public by construction: the Bayes ceiling uses the generator's chains and topic prior (its "
                    "parameters, drawn from the public data seed) and the unigram baseline the public corpus's most "
                    "frequent word; both are scored on the held-out test set")


def _stats(cfg: SyntheticConfig, sizes: np.ndarray, train: np.ndarray,
           vocab: Vocabulary) -> dict:
    lengths = ((train >= 1) & (train < vocab.oov_id)).sum(axis=1)
    counts = np.bincount(train[:, 1:][scored_positions(train, vocab)], minlength=vocab.size)
    top = np.sort(counts)[::-1]
    return {
        "num_train_sentences": int(sizes.sum()),
        "num_train_words": int(counts.sum()),
        "sentences_per_user_mean": float(sizes.mean()),
        "sentences_per_user_median": float(np.median(sizes)),
        "sentences_per_user_max": int(sizes.max()),
        "mean_sentence_words": float(lengths.mean()),
        "truncated_fraction": float((lengths >= cfg.seq_len).mean()),
        "distinct_words_seen": int((counts > 0).sum()),
        "top100_word_share": float(top[:100].sum() / max(counts.sum(), 1)),
    }


def generate_with_truth(cfg: SyntheticConfig) -> tuple[FederatedDataset, SyntheticTruth]:
    """Generate the dataset and return it with its hidden ground truth."""
    _validate(cfg)
    ss = np.random.SeedSequence(cfg.seed)
    rng_chain, rng_users, rng_train, rng_test, rng_pub = (
        np.random.default_rng(s) for s in ss.spawn(5))
    chains = build_chains(cfg, rng_chain)
    vocab = chains.vocab

    sizes = user_sentence_counts(cfg, rng_users)
    mixtures = rng_users.dirichlet(np.full(cfg.num_topics, cfg.user_concentration),
                                   size=cfg.num_users)
    owner = np.repeat(np.arange(cfg.num_users), sizes)
    topics = _draw_topics(mixtures[owner], rng_train)
    train = sample_sentences(chains, topics, cfg.seq_len, rng_train)
    splits = np.cumsum(sizes)[:-1]
    users = np.split(train, splits)
    user_topics = np.split(topics, splits)

    prior = (sizes[:, None] * mixtures).sum(axis=0) / sizes.sum()
    test_users = rng_test.choice(cfg.num_users, size=cfg.num_test, p=sizes / sizes.sum())
    test_topics = _draw_topics(mixtures[test_users], rng_test)
    test = sample_sentences(chains, test_topics, cfg.seq_len, rng_test)

    pub_topics = public_topics(cfg, rng_pub)
    pub = sample_sentences(chains, pub_topics, cfg.seq_len, rng_pub)

    ceiling = ceiling_accuracy(chains, prior, test)
    unigram, top_word = unigram_accuracy(pub, test, vocab)
    info = asdict(cfg) | _stats(cfg, sizes, train, vocab) | {
        "ceiling_accuracy": ceiling,
        "unigram_accuracy": unigram,
        "unigram_word": top_word,
        "oracle_topic_accuracy": oracle_topic_accuracy(chains, test, test_topics),
        "bigram_bayes_accuracy": bigram_bayes_accuracy(chains, prior, test, cfg.seq_len),
    }
    ds = FederatedDataset(
        name="synthetic", vocab=vocab, seq_len=cfg.seq_len, users=users, test=test,
        ceiling_accuracy=ceiling, unigram_accuracy=unigram, reference_source=REFERENCE_SOURCE,
        public=PublicCorpus(sentences=pub, topics=pub_topics,
                            private_topics=frozenset(range(cfg.num_topics))),
        info=info)
    truth = SyntheticTruth(chains=chains, user_mixtures=mixtures, user_topics=user_topics,
                           topic_prior=prior, test_topics=test_topics, test_users=test_users)
    return ds, truth


def generate(cfg: SyntheticConfig | None = None) -> FederatedDataset:
    """Generate the synthetic federated dataset (deterministic in ``cfg.seed``)."""
    return generate_with_truth(cfg or SyntheticConfig())[0]


# --- config options (fedpriv/schema/parser.py registers them with Hydra) -------------------------


_GENERATOR = SyntheticConfig()  # the one copy of the generator's defaults


@dataclass
class SyntheticParams(Section):
    """``data.synthetic``: the embedded generator's knobs (fedpriv/data/synthetic.py): their defaults,
    checks and meanings are the generator's own (:class:`SyntheticConfig`)."""

    meanings_from: ClassVar[type] = SyntheticConfig  # fedpriv.schema.meanings reads that class's comments

    vocab_size: int = _GENERATOR.vocab_size
    num_users: int = _GENERATOR.num_users
    num_topics: int = _GENERATOR.num_topics
    num_public_topics: int = _GENERATOR.num_public_topics
    mean_sentences: float = _GENERATOR.mean_sentences
    max_sentences_per_user: int = _GENERATOR.max_sentences_per_user
    num_test: int = _GENERATOR.num_test
    num_public: int = _GENERATOR.num_public
    public_private_fraction: float = _GENERATOR.public_private_fraction

    def check(self, path: str) -> None:
        _validate(dataclasses.replace(_GENERATOR, **dataclasses.asdict(self)), path)


@dataclass
class SyntheticData(TextPipeline):
    name: str = "synthetic"
    public_source: Literal["embedded", "c4", "text", "none"] = "embedded"
    synthetic: SyntheticParams = field(default_factory=SyntheticParams)

    def example_overrides(self, directory) -> list[str]:
        return [f"data.synthetic.{k}={v}" for k, v in (("num_users", 40), ("vocab_size", 300), ("num_test", 200),
                                                         ("num_public", 200))]

    def public_population(self) -> int:
        """The generator's ``num_users``: the config fixes the population."""
        return int(self.synthetic.num_users)

    def load_words(self) -> FederatedDataset:
        """The generated corpus (before the text pipeline re-encodes it)."""
        return generate(SyntheticConfig(seq_len=self.seq_len, seed=self.seed, **dataclasses.asdict(self.synthetic)))


register_option("data", "synthetic", SyntheticData())
# a small corpus for tests and checks (+experiment=smoke selects it, as it selects model=lstm_tiny)
register_option("data", "synthetic_tiny", SyntheticData(synthetic=SyntheticParams(num_users=40, vocab_size=300,
                                                                                  num_test=200, num_public=200)))

