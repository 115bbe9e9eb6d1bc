"""The MoA draft: its cross-attention never looks past the last verified token (T-step bounded
masking), it drafts losslessly through the shared verify loop, and its loss trains it toward the target."""

from __future__ import annotations

import torch

from models.lm.cache import CachedLM
from models.lm.moa import MoADraft, MoADrafter, bounded_segments
from models.lm.speculative import Tree, speculative_generate
from tests.models.lm.test_speculative import VOCAB, _greedy, _llama


def test_segments_see_only_states_before_them() -> None:
    sees = bounded_segments((4, 200), torch.Generator().manual_seed(0))
    pos = torch.arange(200)
    assert torch.all(sees <= torch.clamp(pos - 1, min=0))  # never a token's own or a later state (but position 0)
    starts = (sees[:, 1:] != sees[:, :-1]).sum(1)
    assert torch.all(starts >= 200 // 14 - 1) and torch.all(starts <= 200 // 6)  # segments of 6..14 tokens


def test_no_output_depends_on_states_a_token_may_not_see() -> None:
    target = _llama(0)
    draft = MoADraft.for_target(target)
    tokens = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))
    out = target(input_ids=tokens, use_cache=True)
    states = draft.target_states(out.cache, 40)
    sees = bounded_segments(tokens.shape, torch.Generator().manual_seed(2))
    base = draft(tokens, states, sees)
    noisy = states.clone()
    noisy[:, 20:] += torch.randn_like(noisy[:, 20:])  # change every state from position 20 on
    moved = draft(tokens, noisy, sees)
    blind = sees < 20
    assert torch.equal(base[blind], moved[blind]) and not torch.allclose(base[~blind], moved[~blind])


def _pattern(n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """Arithmetic progressions mod VOCAB with a step of 1, 2 or 3: a language a tiny model learns."""
    start = torch.randint(0, VOCAB, (n, 1), generator=gen)
    step = torch.randint(1, 4, (n, 1), generator=gen)
    return (start + step * torch.arange(length)) % VOCAB


def _pattern_target() -> torch.nn.Module:
    target = _llama(0).float().train()
    opt = torch.optim.AdamW(target.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(150):
        batch = _pattern(32, 24, gen)
        loss = target(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    target = target.eval()  # float32: confident on its language, so no near tie flips an argmax
    for p in target.parameters():
        p.requires_grad_(False)
    return target


def test_moa_drafts_losslessly_and_learns_the_target() -> None:
    torch.manual_seed(0)
    target = _pattern_target()
    draft = MoADraft.for_target(target)
    gen = torch.Generator().manual_seed(1)
    prompts = [row.tolist() for row in _pattern(3, 4, gen)]
    before = [speculative_generate(target, MoADrafter(draft), p, 24, k=4)[1].accept_length for p in prompts]
    for p in prompts:
        assert speculative_generate(target, MoADrafter(draft), p, 24, k=4)[0] == _greedy(target, p, 24)
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=3e-3)
    first = None
    for _ in range(100):
        loss, stats = draft.loss(target, _pattern(16, 32, gen), gen)
        first = first if first is not None else float(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss) < 0.6 * first, (first, float(loss), stats)
    after = [speculative_generate(target, MoADrafter(draft), p, 24, k=4)[1].accept_length for p in prompts]
    assert sum(after) / 3 > 2.5 > max(before), (before, after)  # of at most k + 1 = 5 tokens per target call
    for p in prompts:
        assert speculative_generate(target, MoADrafter(draft), p, 24, k=4)[0] == _greedy(target, p, 24)

    for how in (dict(tree=Tree(depth=4, branch=2, width=3)), dict(k=6, adaptive=True)):
        for p in prompts:
            assert speculative_generate(target, MoADrafter(draft), p, 24, **how)[0] == _greedy(target, p, 24), how  # type: ignore[arg-type]


def test_incremental_drafts_equal_a_full_forward() -> None:
    """The drafters' caches (target states, self-attention keys/values, EAGLE's features) give the
    logits a full forward over the whole sequence gives, across verified steps and drafted paths."""
    from models.lm.eagle import EagleDraft, EagleDrafter

    target = _llama(0)
    moa, eagle = MoADraft.for_target(target).double(), EagleDraft.for_target(target).double()
    for module in (moa, eagle):  # random, not zero, positions and layer positions
        for name, param in module.named_parameters():
            if "position" in name:
                torch.nn.init.normal_(param, std=0.5)
    seq = [3, 1, 4, 1, 5, 9, 2]
    lm = CachedLM(target, keep_hidden=True)
    lm.reset()
    drafters = {"moa": MoADrafter(moa), "eagle": EagleDrafter(eagle)}
    for d in drafters.values():
        d.reset(seq)
        d.attach_target(lm)
    rng = torch.Generator().manual_seed(0)
    for _ in range(4):
        lm.logits(seq, upto=len(seq) - 1)
        paths = [torch.randint(0, VOCAB, (3,), generator=rng).tolist() for _ in range(2)]
        verified = len(seq) - 1
        out = target(input_ids=torch.tensor([seq[:-1]]), use_cache=True, output_hidden_states=True)
        for name, d in drafters.items():
            assert d.prepare(seq)
            for depth in range(4):
                got = d.path_logits(seq, [p[:depth] for p in paths])
                for row, p in enumerate(paths):
                    ids = torch.tensor([seq + p[:depth]])
                    if name == "moa":
                        states = moa.target_states(out.cache, verified)
                        full = moa(ids, states, torch.full(ids.shape, verified - 1))[0, -1]
                        want = moa.head(full)
                    else:  # features: the target's for the verified tokens, then the draft's own predictions
                        feats = out.hidden_states[-1][0]
                        for i in range(depth + 1):
                            nxt = torch.tensor([seq[1:] + p[:i]])
                            pred = eagle(feats[None], nxt)[0, -1]
                            feats = torch.cat([feats, pred[None]])
                        want = eagle.head(pred)
                    assert torch.allclose(torch.from_numpy(got[row]), want.double(), atol=1e-9), (name, depth)
        seq += [*paths[0][:2], int(torch.randint(0, VOCAB, (1,), generator=rng))]
        lm.crop(len(seq) - 1)
