"""From a chat-completions request body to fully decided answers (no timing, no HTTP).

``prepare`` validates the body the way the engines do (messages, n, max tokens, model name),
renders the prompt with the tokenizer, checks the context length and draws one ``ChoiceOut``
per sample: the generated text, its output token ids (ending with the EOS id when the answer
stopped naturally), the token end offsets used for streaming, and the parsed message fields.
Errors come back as ``errors.RefusedRequestError(status, message)``; the server turns them into
the flavour's error body. Answers depend only on (seed, request ``seed``, rendered prompt,
sample index), so the same prompt gets the same answer on every server and after every retry.
"""

from __future__ import annotations

import random
import uuid
from bisect import bisect_left
from collections import OrderedDict
from typing import Any

import msgspec

from draftdata.errors import RefusedRequestError
from draftdata.records import Message
from draftdata.shared.domains import classify_domain
from draftdata.sim.answers import (
    Parsed,
    digest,
    draw_length,
    looks_like_code,
    parse_completion,
    plan_answer,
)
from draftdata.sim.config import ROLES, SimConfig
from draftdata.sim.shapes import context_message, tool_call
from draftdata.sim.spec import SpecDraw
from draftdata.sim.spec import draw as spec_draw
from draftdata.sim.tokens import Tokenizer, text_of


class ChoiceOut(msgspec.Struct, kw_only=True):
    """One decided sample."""

    text: str
    ids: list[int]
    ends: list[int]
    parsed: Parsed
    calls: list[dict[str, Any]]
    finish: str
    matched_stop: int | None
    reasoning_tokens: int
    spec: SpecDraw | None = None  # speculative figures (a server with spec_tokens > 0)


class Prepared(msgspec.Struct, kw_only=True):
    """A validated request with its answers decided."""

    rid: str
    model: str
    stream: bool
    include_usage: bool
    prompt_ids: list[int]
    cached_tokens: int | None
    want_prompt_ids: bool
    want_output_ids: bool
    want_spec_details: bool = False  # SGLang's return_spec_tokens_details
    choices: list[ChoiceOut]


class PrefixCache:
    """A per-server stand-in for the radix/prefix cache: which prompt prefixes were seen."""

    def __init__(self, capacity: int = 20_000) -> None:
        self._seen: OrderedDict[int, None] = OrderedDict()
        self._capacity = capacity

    def cached(self, messages: list[dict[str, Any]], prompt_tokens: int) -> int:
        """Tokens of the longest seen message prefix (prorated by characters), then record."""
        sizes = [len(text_of(m.get("content"))) + 16 for m in messages]
        total = sum(sizes) or 1
        best = 0
        acc = 0
        keys = []
        for k in range(1, len(messages) + 1):
            acc += sizes[k - 1]
            key = digest(messages[:k])
            keys.append(key)
            if key in self._seen:
                best = acc
                self._seen.move_to_end(key)
        for key in keys:
            self._seen[key] = None
        while len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        if best >= total:
            return max(0, prompt_tokens - 1)
        return int(prompt_tokens * best / total)


def _int_field(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RefusedRequestError(400, f"{name}: expected an integer, got {value!r}")
    return value


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise RefusedRequestError(400, "messages: field required (a non-empty list of messages)")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RefusedRequestError(400, f"messages.{i}: expected an object with a string 'role'")
        if m["role"] not in ROLES:
            raise RefusedRequestError(400, f"messages.{i}.role: unknown role {m['role']!r}")
    return msgs


def _cap(
    text: str, ids: list[int], ends: list[int], eos: int, limit: int
) -> tuple[str, list[int], list[int], bool]:
    """Cut to ``limit`` tokens counting the EOS; returns (text, ids, ends, hit_limit)."""
    if len(ids) + 1 <= limit:
        return text, [*ids, eos], ends, False
    keep = max(0, limit)
    cut = ends[keep - 1] if keep > 0 else 0
    return text[:cut], ids[:keep], ends[:keep], True


def _stops(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        raise RefusedRequestError(400, "stop: expected a string or a list of strings")
    return [x for x in items if x]


def _stop_at(
    text: str, ids: list[int], ends: list[int], stops: list[str]
) -> tuple[str, list[int], list[int]] | None:
    """Cut at the first stop string as vLLM does: the text ends before it, the ids keep every
    token up to the one that completes it (no end-of-turn token follows)."""
    hits = [(at, len(s)) for s in stops if (at := text.find(s)) >= 0]
    if not hits:
        return None
    at, size = min(hits)
    keep = bisect_left(ends, at + size) + 1
    return text[:at], ids[:keep], ends[:keep]


def _mean_for(config: SimConfig, last_user: str, msgs: list[Any], tools: Any) -> int:
    """The mean output length for this request: a matching ``mean_output_tokens_for`` prefix,
    else the conversation's domain's ``domain_mean_output_tokens``, else the default."""
    for prefix, mean in config.mean_output_tokens_for.items():
        if last_user.startswith(prefix):
            return mean
    if config.domain_mean_output_tokens:
        try:
            messages = msgspec.convert(msgs, list[Message])
        except msgspec.ValidationError:
            return config.mean_output_tokens
        domain = classify_domain(messages, tools if isinstance(tools, list) else None)
        return config.domain_mean_output_tokens.get(domain, config.mean_output_tokens)
    return config.mean_output_tokens


def prepare(
    body: Any,
    config: SimConfig,
    tokenizer: Tokenizer,
    cache: PrefixCache | None,
    default_thinking: bool | None = None,
    requests: int = 1,
) -> Prepared:
    """Validate ``body`` and decide every answer; raise RefusedRequestError where the engine
    would refuse it. ``default_thinking``: the server template's default ``enable_thinking``
    (None: thinking unless ``config.reasoning`` is "off"); ``requests``: the server's chat
    requests so far, this one included (``unsupported_after``)."""
    if not isinstance(body, dict):
        raise RefusedRequestError(400, "the request body must be a JSON object")
    refusing = requests > config.unsupported_after
    fields = [f for f in config.unsupported if not f.startswith("role:")]
    for field in fields if refusing else []:  # an engine or API without this option
        if field in body:
            raise RefusedRequestError(400, f"Unsupported parameter: {field}")
    msgs = _messages(body)
    roles = {f.removeprefix("role:") for f in config.unsupported if f.startswith("role:")}
    for role in sorted(roles) if refusing else []:
        # a chat template that cannot take these messages (tool results, an assistant turn in
        # the history): a conversation's first request passes, its later ones do not
        if any(m["role"] == role for m in msgs):
            raise RefusedRequestError(400, f"Unsupported message role: {role}")
    flavor = config.flavor
    model = body.get("model")
    if flavor == "vllm" and model not in (None, config.model):
        raise RefusedRequestError(404, f"The model `{model}` does not exist.")
    n = _int_field(body, "n") or 1
    if n < 1 or n > 128:
        raise RefusedRequestError(400, f"n: must be between 1 and 128, got {n}")
    if config.max_choices is not None:  # a server that answers fewer choices than asked
        n = min(n, config.max_choices)
    max_new = _int_field(body, "max_completion_tokens")
    if max_new is None:
        max_new = _int_field(body, "max_tokens")
    if max_new is not None and max_new < 1:
        raise RefusedRequestError(400, f"max_tokens: must be at least 1, got {max_new}")
    stops = _stops(body)
    tools = body.get("tools") or None
    if tools is not None and not isinstance(tools, list):
        raise RefusedRequestError(400, "tools: expected a list of tool specs")
    tool_choice = body.get("tool_choice", "auto" if tools else "none")
    kwargs = dict(body.get("chat_template_kwargs") or {})
    if default_thinking is not None:
        kwargs.setdefault("enable_thinking", default_thinking)
    elif config.reasoning == "off":
        kwargs.setdefault("enable_thinking", False)
    thinking = kwargs.get("enable_thinking", True) is not False
    separate = body.get("separate_reasoning", True) is not False
    include = body.get("include_reasoning", True) is not False
    reasoning_parser = config.reasoning == "parsed" and (flavor == "vllm" or separate)
    tool_parser = bool(tools) and tool_choice != "none"

    try:
        prompt_text = tokenizer.render_prompt(msgs, tools, kwargs)
    except Exception as exc:  # a template error is the request's fault
        raise RefusedRequestError(400, f"cannot apply the chat template: {exc}") from exc
    prompt_ids, _ = tokenizer.encode(prompt_text)
    n_prompt = len(prompt_ids)
    too_long = context_message(flavor, n_prompt, max_new, config.context_length)
    if too_long:
        raise RefusedRequestError(400, too_long)
    limit = config.context_length - n_prompt - (1 if flavor == "sglang" else 0)
    if max_new is not None:
        limit = min(limit, max_new)

    last_user = next((text_of(m.get("content")) for m in reversed(msgs) if m["role"] == "user"), "")
    code = looks_like_code(last_user)
    forced = tool_choice == "required" or isinstance(tool_choice, dict)
    offered = tools if tool_parser else None
    if isinstance(tool_choice, dict) and tools:
        name = (tool_choice.get("function") or {}).get("name")
        offered = [t for t in tools if (t.get("function") or {}).get("name") == name] or tools
    mean = _mean_for(config, last_user, msgs, tools)
    accept = config.accept_rate_of(last_user)
    choices = []
    for i in range(n):
        rng = random.Random(digest(config.seed, body.get("seed"), prompt_text, i))
        target = draw_length(rng, mean, config.output_sigma, config.min_output_tokens)
        call = offered is not None and (forced or rng.random() < config.tool_call_rate)
        state = rng.getstate()
        target = min(target, limit + 16)  # no need to write what max_tokens cuts off
        words = target
        for _attempt in range(2):
            # A real tokenizer spends several tokens per word: re-plan once with fewer words
            # (same random state, so still deterministic) to land near the drawn token count.
            rng.setstate(state)
            answer = plan_answer(
                rng,
                target_tokens=words,
                reasoning=thinking,
                reasoning_share=config.reasoning_share,
                code=code,
                tools=offered,
                tool_call=call,
            )
            try:
                text = tokenizer.render_completion(msgs, tools, kwargs, prompt_text, answer)
            except Exception as exc:
                raise RefusedRequestError(400, f"cannot apply the chat template: {exc}") from exc
            ids, ends = tokenizer.encode(text)
            if len(ids) <= target * 1.15 or words <= config.min_output_tokens:
                break
            words = max(config.min_output_tokens, int(words * target / len(ids)))
        stopped = _stop_at(text, ids, ends, stops) if stops else None
        if stopped is not None and len(stopped[1]) <= limit:
            (text, out_ids, ends), hit = stopped, False
        else:
            stopped = None
            text, out_ids, ends, hit = _cap(text, ids, ends, tokenizer.eos_id, limit)
        parsed = parse_completion(
            text,
            flavor=flavor,
            reasoning_parser=reasoning_parser,
            thinking=thinking,
            include_reasoning=include,
            tool_parser=tool_parser,
        )
        finish = "length" if hit else ("tool_calls" if parsed.tool_calls else "stop")
        calls = []
        for k, tc in enumerate(parsed.tool_calls):
            hexid = f"{digest(prompt_text, i, k):016x}"
            cid = f"call_{hexid}{hexid[:8]}" if flavor == "sglang" else f"chatcmpl-tool-{hexid}"
            calls.append(tool_call(flavor, cid, k, tc.name, tc.arguments))
        spec = None
        if config.spec_tokens > 0:
            spec_rng = random.Random(digest(config.seed, "spec", prompt_text, body.get("seed"), i))
            spec = spec_draw(len(out_ids), config.spec_tokens, accept, spec_rng)
        r_end = max((s1 for s0, s1, kind in parsed.spans if kind == "reasoning"), default=0)
        r_tokens = sum(1 for e in ends if e <= r_end) if r_end else 0
        choices.append(
            ChoiceOut(
                text=text,
                ids=out_ids,
                ends=ends,
                parsed=parsed,
                calls=calls,
                finish=finish,
                matched_stop=tokenizer.eos_id
                if finish == "stop" and flavor == "sglang" and stopped is None
                else None,
                reasoning_tokens=r_tokens,
                spec=spec,
            )
        )
    rid = body.get("rid") if isinstance(body.get("rid"), str) else None
    if rid is None:
        rid = uuid.uuid4().hex if flavor == "sglang" else f"chatcmpl-{uuid.uuid4().hex}"
    stream_options = body.get("stream_options") or {}
    if flavor == "sglang":
        want_prompt = body.get("return_prompt_token_ids") is True
        want_output = body.get("return_token_ids") is True
    else:
        want_prompt = want_output = body.get("return_token_ids") is True
    if not config.token_ids:
        want_prompt = want_output = False
    return Prepared(
        rid=rid,
        model=(model or "default") if flavor == "sglang" else config.model,
        stream=body.get("stream") is True,
        include_usage=isinstance(stream_options, dict)
        and stream_options.get("include_usage") is True,
        prompt_ids=prompt_ids,
        cached_tokens=cache.cached(msgs, n_prompt) if cache and config.cache_report else None,
        want_prompt_ids=want_prompt,
        want_output_ids=want_output,
        want_spec_details=flavor == "sglang" and body.get("return_spec_tokens_details") is True,
        choices=choices,
    )
