"""Learnability check of the synthetic corpus: Bayes ceiling vs count models fitted on train data.

Prints, for a synthetic config (the default unless overridden with ``key=value`` arguments):

* ``ceiling``      Bayes-optimal user-agnostic accuracy (knows the chains and the topic prior);
* ``oracle topic`` the same predictor told each test sentence's topic (upper bound);
* ``bigram bayes`` the exact population bigram (the best predictor that sees only the previous
  token: ``argmax_w Σ_k π_k v_k(prev) P_k(w | prev)``, ``v_k`` expected visits);
* ``unigram``      always the training data's most frequent word;
* ``bigram count`` argmax of next-word counts given the previous token in the training users'
  data, backing off to the unigram for unseen tokens;
* ``mixture EM``   a mixture of ``K`` bigram models fitted by EM on the training sentences (no
  labels), predicting with its own topic posterior from the prefix, as the Bayes predictor does.

Usage: ``python scripts/synthetic_baselines.py [num_users=3000 vocab_size=3000 ...]``
"""

from __future__ import annotations

import sys
import time
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from fedpriv.data.federated import Vocabulary  # noqa: E402
from fedpriv.data.synthetic import SyntheticConfig, generate_with_truth  # noqa: E402
from fedpriv.data.synthetic_oracle import scored_positions  # noqa: E402


def parse_overrides(args: list[str]) -> SyntheticConfig:
    """``key=value`` overrides of the default config."""
    cfg = SyntheticConfig()
    types = {f.name: type(getattr(cfg, f.name)) for f in fields(cfg)}
    kv = dict(a.split("=", 1) for a in args)
    return replace(cfg, **{k: types[k](v) for k, v in kv.items()})


def transitions(rows: np.ndarray, vocab: Vocabulary) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row index, previous state, target word) of every scored position; BOS is state 0."""
    mask = scored_positions(rows, vocab)
    prev = rows[:, :-1]
    state = np.where(prev == vocab.bos_id, 0, prev)
    r = np.nonzero(mask)[0]
    return r, state[mask], rows[:, 1:][mask]


def bigram_count_accuracy(train: np.ndarray, test: np.ndarray, vocab: Vocabulary) -> float:
    """Argmax next word given the previous token, unigram backoff for unseen tokens."""
    n_states = vocab.oov_id  # states 0..V
    _, s, w = transitions(train, vocab)
    counts = sp.coo_matrix((np.ones(len(s)), (s, w)), shape=(n_states, n_states)).tocsr()
    best = np.asarray(counts.argmax(axis=1)).ravel()
    seen = np.asarray(counts.sum(axis=1)).ravel() > 0
    best[~seen] = np.argmax(np.bincount(w, minlength=n_states))
    _, ts, tw = transitions(test, vocab)
    return float((best[ts] == tw).mean())


class BigramMixture:
    """Mixture of bigram models over observed (state, word) pairs, fitted by EM."""

    def __init__(self, k: int, train: np.ndarray, vocab: Vocabulary, smoothing: float = 0.1,
                 seed: int = 0) -> None:
        self.k, self.vocab, self.smoothing = k, vocab, smoothing
        r, s, w = transitions(train, vocab)
        width = vocab.oov_id
        key = s * width + w
        self.pairs, pair_idx = np.unique(key, return_inverse=True)
        self.pair_state = self.pairs // width
        self.counts = sp.csr_matrix((np.ones(len(r)), (r, pair_idx)),
                                    shape=(len(train), len(self.pairs)))
        rng = np.random.default_rng(seed)
        self.resp = rng.dirichlet(np.ones(k), size=len(train))
        self.weights = self.resp.mean(axis=0)
        self._m_step()

    def _m_step(self) -> None:
        """Component weights and smoothed bigram tables from the responsibilities."""
        c = (self.counts.T @ self.resp).T + self.smoothing  # [K, pairs]
        n_states = self.vocab.oov_id
        tot = np.zeros((self.k, n_states))
        for j in range(self.k):
            tot[j] = np.bincount(self.pair_state, weights=c[j], minlength=n_states)
        self.logp = np.log(c) - np.log(tot[:, self.pair_state])
        self.weights = self.resp.mean(axis=0)

    def _e_step(self) -> float:
        """Responsibilities of each sentence; returns the mean log-likelihood."""
        ll = self.counts @ self.logp.T + np.log(self.weights)
        m = ll.max(axis=1, keepdims=True)
        self.resp = np.exp(ll - m)
        z = self.resp.sum(axis=1, keepdims=True)
        self.resp /= z
        return float((m + np.log(z)).mean())

    def fit(self, iters: int) -> BigramMixture:
        for _ in range(iters):
            self._e_step()
            self._m_step()
        return self

    def accuracy(self, test: np.ndarray, floor: float = -20.0) -> float:
        """Predict with the posterior over components given the prefix (unseen pairs: floor)."""
        width = self.vocab.oov_id
        r, s, w = transitions(test, self.vocab)
        idx = np.searchsorted(self.pairs, s * width + w)
        idx = np.minimum(idx, len(self.pairs) - 1)
        hit = self.pairs[idx] == s * width + w
        lp = np.where(hit[None], self.logp[:, idx], floor)  # [K, N]
        # Exclusive cumulative log-likelihood within each test row.
        cum = np.cumsum(lp, axis=1) - lp
        first = np.r_[True, r[1:] != r[:-1]]
        start = np.maximum.accumulate(np.where(first, np.arange(len(r)), 0))
        logpost = np.log(self.weights)[:, None] + cum - cum[:, start]
        logpost -= logpost.max(axis=0, keepdims=True)
        post = np.exp(logpost).T
        post /= post.sum(axis=1, keepdims=True)
        return float((self._predict(s, post) == w).mean())

    def _predict(self, states: np.ndarray, post: np.ndarray) -> np.ndarray:
        """``argmax_w Σ_k post[n, k] P_k(w | state)`` over words seen after the state (else 0)."""
        pred = np.zeros(len(states), dtype=np.int64)
        bounds = np.searchsorted(self.pair_state, np.arange(self.vocab.oov_id + 1))
        probs = np.exp(self.logp)
        order = np.argsort(states, kind="stable")
        uniq, starts = np.unique(states[order], return_index=True)
        for st, sel in zip(uniq, np.split(order, starts[1:])):
            a, b = bounds[st], bounds[st + 1]
            if a < b:
                words = self.pairs[a:b] % self.vocab.oov_id
                pred[sel] = words[np.argmax(post[sel] @ probs[:, a:b], axis=1)]
        return pred


def main(argv: list[str]) -> None:
    cfg = parse_overrides(argv)
    t0 = time.perf_counter()
    ds, _ = generate_with_truth(cfg)
    gen_s = time.perf_counter() - t0
    train = np.concatenate(ds.users)
    info = ds.info
    ceiling = ds.ceiling_accuracy
    print(f"generation: {gen_s:.2f} s  ({info['num_train_sentences']} train sentences, "
          f"{info['num_train_words']} words, {cfg.num_users} users, "
          f"{info['mean_sentence_words']:.1f} words/sentence, "
          f"user sizes median {info['sentences_per_user_median']:.0f} "
          f"max {info['sentences_per_user_max']})")

    def line(name: str, acc: float) -> None:
        print(f"{name:<14}{acc:7.4f}   {acc / ceiling:6.1%} of ceiling")

    line("ceiling", ceiling)
    line("oracle topic", info["oracle_topic_accuracy"])
    line("bigram bayes", info["bigram_bayes_accuracy"])
    line("unigram", ds.unigram_accuracy)
    line("bigram count", bigram_count_accuracy(train, ds.test, ds.vocab))
    t0 = time.perf_counter()
    em = BigramMixture(cfg.num_topics, train, ds.vocab, seed=cfg.seed).fit(iters=30)
    line("mixture EM", em.accuracy(ds.test))
    print(f"(EM fit+eval {time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
