"""Every position the model runs, run once: a trie of token prefixes with their keys and values.

Recovery scores thousands of sequences that differ from each other in a few tokens (a word cut
another way, then the same draft again). Running each from where it leaves the last cached one
runs the shared parts again and again: on a held-out sample at temperature 1.3 the search ran
16,199 tokens through the model for 5,525 distinct prefixes. Here a node is one token after one
prefix; its keys and values (every layer) and the distribution after it are computed once.

A batch of new nodes, from any branches, runs in one forward pass: each attends to its own
ancestors only (a tree attention mask, as speculative decoding verifies a tree of drafts), at the
position of its depth, so its keys, values and logits are those of its own sequence run alone
(up to float rounding, as with any batching). No row is padded and no cache is copied.

A node also keeps its last hidden state, so an id asked for later at a position already run (a
token re-cut in two, another sample's divergence) costs one row of the output layer, not a pass
through every layer again. Where the logits are not the output layer of that state (a soft cap,
a logit scale), the node runs again instead.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from recon.recovery.model import SequenceLogprobs

#: new nodes per forward pass (the logits of a pass are nodes x vocabulary floats)
CHUNK = 384


class PrefixTree:
    """The nodes run so far for one sampling distribution (:class:`~recon.recovery.sampling.Sampling`).

    Per node: its parent, token and depth (its position in every sequence through it); once run,
    its keys and values in every layer and its last hidden state (slot = node index), the
    ``top_k`` most likely tokens at the next position, and the logprob of every token asked for there.
    """

    def __init__(self, model, sampling, top_k: int):
        self.model, self.sampling, self.top_k = model, sampling, top_k
        self.parent: list[int] = []
        self.token: list[int] = []
        self.depth: list[int] = []
        self.children: dict[tuple[int, int], int] = {}
        #: per node: {token: logprob at the next position} once run, else None
        self.dist: list[dict[int, float] | None] = []
        #: per node: the ``top_k`` (token, logprob) at the next position, most likely first
        self.top: list[list[tuple[int, float]]] = []
        #: per node: {token: 1-based rank at the next position} for the tokens that followed it when run
        self.rank: list[dict[int, int]] = []
        self.keys: list = []  # per layer: [kv heads, capacity, head dim]
        self.values: list = []
        net = model.model
        config = getattr(net, "config", None)
        #: the logits are the output layer of the last hidden state (as LlamaForCausalLM computes them)
        self.plain_head = not (getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None))
        self.hidden = None  # [capacity, hidden size], slot = node index
        self.tokens_run = 0  # positions run through the model
        self.passes_run = 0  # forward passes that ran them

    def __len__(self) -> int:
        return len(self.parent)

    def path(self, seq: Sequence[int]) -> list[int]:
        """The node of every prefix ``seq[:i + 1]``, created where missing (not run)."""
        out, node = [], -1
        for t in seq:
            child = self.children.get((node, t))
            if child is None:
                child = len(self.parent)
                self.children[(node, t)] = child
                self.parent.append(node)
                self.token.append(t)
                self.depth.append(len(out))
                self.dist.append(None)
                self.top.append([])
                self.rank.append({})
            out.append(child)
            node = child
        return out

    def score(self, seqs: Sequence[Sequence[int]], alternatives: Sequence[dict[int, list[int]]]) -> list[SequenceLogprobs]:
        """Per sequence: the logprob of each token, its rank where known, and at each position
        the ``top_k`` plus the ids ``alternatives`` asks for there."""
        paths = [self.path(s) for s in seqs]
        asked: dict[int, set[int]] = {}
        nexts: dict[int, set[int]] = {}
        for s, path, alt in zip(seqs, paths, alternatives):
            for i in range(1, len(s)):
                node = path[i - 1]
                asked.setdefault(node, set()).add(s[i])
                nexts.setdefault(node, set()).add(s[i])
                if alt.get(i):
                    asked[node].update(alt[i])
        missing = [node for node, ids in asked.items() if self.dist[node] is None or not ids <= self.dist[node].keys()]
        again = [n for n in missing if self.dist[n] is not None and self.plain_head]
        todo = [n for n in missing if self.dist[n] is None or not self.plain_head]
        todo.sort(key=self.depth.__getitem__)  # parents first: a chunk's parents are run or in it
        for k in range(0, len(todo), CHUNK):
            self._run(todo[k : k + CHUNK], asked, nexts)
        for k in range(0, len(again), CHUNK):
            self._head(again[k : k + CHUNK], asked, nexts)
        out = []
        for s, path, alt in zip(seqs, paths, alternatives):
            lps: list[float | None] = [None]
            rks: list[int | None] = [None]
            tops: list = [None]
            for i in range(1, len(s)):
                node = path[i - 1]
                lps.append(self.dist[node][s[i]])
                rks.append(self.rank[node].get(s[i]))
                tops.append((node, alt.get(i) or ()))
            out.append(SequenceLogprobs(lps, rks, _Pairs(self, tops)))
        return out

    def _run(self, nodes: list[int], asked: dict[int, set[int]], nexts: dict[int, set[int]]) -> None:
        """One forward pass over ``nodes`` (their unrun ancestors among them), each attending to its ancestors."""
        torch = self.model.torch
        parent = np.asarray(self.parent, dtype=np.int64)
        new = np.asarray(nodes, dtype=np.int64)
        m = len(new)
        col = np.full(len(parent), -1, dtype=np.int64)
        col[new] = np.arange(m)
        rows, anc = [], []
        cur, live = parent[new], np.arange(m)
        while len(live):  # every (new node, ancestor) pair, one generation a step
            keep = cur >= 0
            cur, live = cur[keep], live[keep]
            rows.append(live)
            anc.append(cur)
            cur = parent[cur]
        rows_a, anc_a = np.concatenate(rows), np.concatenate(anc)
        past = np.unique(anc_a[col[anc_a] < 0])  # run before: their keys and values come from the store
        p = len(past)
        col[past] = np.arange(p)
        col[new] = p + np.arange(m)
        mask = np.zeros((m, p + m), dtype=bool)
        mask[rows_a, col[anc_a]] = True
        mask[np.arange(m), p + np.arange(m)] = True
        from transformers import DynamicCache

        model = self.model.model
        cache = DynamicCache(config=model.config)
        if p and self.keys:
            idx = torch.from_numpy(past)
            for layer, (k, v) in enumerate(zip(self.keys, self.values)):
                cache.update(k[:, idx].unsqueeze(0), v[:, idx].unsqueeze(0), layer)
        ids = torch.tensor([[self.token[n] for n in nodes]])
        pos = torch.tensor([[self.depth[n] for n in nodes]])
        net = model.base_model if self.plain_head else model
        with torch.inference_mode():
            out = net(input_ids=ids, position_ids=pos, attention_mask=torch.from_numpy(mask)[None, None],
                      use_cache=True, **{_cache_arg(net): cache})
            self._store(cache, p, new)
            if self.plain_head:
                hidden = out.last_hidden_state[0]
                self._keep_hidden(hidden, new)
                logits = model.get_output_embeddings()(hidden)
            else:
                logits = out.logits[0]
            self._read(nodes, self.sampling.log_probs(logits), asked, nexts, fresh=True)
        self.tokens_run += m
        self.passes_run += 1

    def _head(self, nodes: list[int], asked: dict[int, set[int]], nexts: dict[int, set[int]]) -> None:
        """Ids asked for at nodes already run: the output layer on their kept hidden states, no pass."""
        torch = self.model.torch
        with torch.inference_mode():
            logits = self.model.model.get_output_embeddings()(self.hidden[torch.tensor(nodes)])
            self._read(nodes, self.sampling.log_probs(logits), asked, nexts, fresh=False)

    def _read(self, nodes: list[int], logp, asked, nexts, fresh: bool) -> None:
        """Keep, per node (row of ``logp``), the top-k, the asked ids' logprobs and the ranks of the tokens that follow it."""
        if fresh:
            values, indices = logp.topk(min(self.top_k, logp.shape[-1]), dim=-1)
            values, indices = values.tolist(), indices.tolist()
        for r, node in enumerate(nodes):
            if fresh:
                self.top[node] = list(zip(indices[r], values[r]))
                self.dist[node] = dict(self.top[node])
            wanted = sorted(asked[node] - self.dist[node].keys())  # a value once kept stays as it was
            self.dist[node].update(zip(wanted, logp[r, wanted].tolist()))
            follow = sorted(nexts[node] - self.rank[node].keys())
            lp = logp[r, follow]
            self.rank[node].update(zip(follow, ((logp[r][None, :] > lp[:, None]).sum(-1) + 1).tolist()))

    def _keep_hidden(self, hidden, new: np.ndarray) -> None:
        torch = self.model.torch
        need = int(new.max()) + 1
        if self.hidden is None:
            self.hidden = hidden.new_empty((max(need, 1024), hidden.shape[-1]))
        elif self.hidden.shape[0] < need:
            grow = max(need, 2 * self.hidden.shape[0])
            self.hidden = torch.cat([self.hidden, hidden.new_empty((grow - self.hidden.shape[0], hidden.shape[-1]))])
        self.hidden[torch.from_numpy(new)] = hidden

    def _store(self, cache, p: int, new: np.ndarray) -> None:
        torch = self.model.torch
        need = int(new.max()) + 1
        for layer, cached in enumerate(cache.layers):
            k, v = cached.keys[0, :, p:], cached.values[0, :, p:]
            if layer == len(self.keys):
                self.keys.append(k.new_empty((k.shape[0], max(need, 1024), k.shape[2])))
                self.values.append(v.new_empty((v.shape[0], max(need, 1024), v.shape[2])))
            if self.keys[layer].shape[1] < need:
                grow = max(need, 2 * self.keys[layer].shape[1])
                self.keys[layer] = torch.cat([self.keys[layer], k.new_empty((k.shape[0], grow - self.keys[layer].shape[1], k.shape[2]))], 1)
                self.values[layer] = torch.cat([self.values[layer], v.new_empty((v.shape[0], grow - self.values[layer].shape[1], v.shape[2]))], 1)
            idx = torch.from_numpy(new)
            self.keys[layer][:, idx] = k
            self.values[layer][:, idx] = v


class _Pairs(list):
    """``top`` of a :class:`SequenceLogprobs`: per position the ``top_k`` (id, logprob), most likely
    first, then the alternatives asked for there, in the order asked. Built when read (a search
    reads a few positions of each sequence it scores, not all of them)."""

    def __init__(self, tree: PrefixTree, at: list):
        super().__init__(at)  # per position: (node before it, ids asked there), None at 0
        self.tree = tree

    def _pairs(self, got):
        if got is None:
            return []
        node, alt = got
        dist = self.tree.dist[node]
        return self.tree.top[node] + [(a, dist[a]) for a in alt]

    def __getitem__(self, i):
        got = super().__getitem__(i)
        if isinstance(i, slice):
            return [self._pairs(g) for g in got]
        return self._pairs(got)

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def _cache_arg(model) -> str:
    """transformers renamed ``past_key_values`` to ``cache`` during 5.x."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
