"""Runbooks: ``runbooks/<rule>.md`` rendered with an incident's facts, and the links to them.

Templates are Jinja2 in a :class:`~jinja2.sandbox.SandboxedEnvironment` (a runbook folder may be
edited by many people; templates cannot reach Python internals such as ``__class__``) with
``StrictUndefined`` (a misspelt variable is an error, not an empty string). The context has one
fixed shape for every rule (:func:`runbook_context`); facts that are not known render as
``unknown``, so a template never needs to test whether a key exists.

Only the runbook author's own Markdown is Markdown. A value printed with ``{{ ... }}`` comes
from telemetry, jobs or alerts (a job name, a label, an Alertmanager annotation) and may hold
``[x](https://evil.example)``, ``<script>``, a ``|`` that splits a table row, a newline and a
``#`` that starts a heading. So the HTML page is rendered in three steps:

1. the template is rendered with every printed value set aside (Jinja's ``finalize``) and
   replaced by an opaque slot mark (``\ue000<n>\ue001``, private-use characters that mean
   nothing to Markdown or HTML and are removed from the values themselves);
2. the Markdown, now the author's text and slot marks only, is converted to HTML by a small
   converter that escapes each line before adding tags (links only to ``http(s)`` and local
   paths);
3. each slot mark is replaced by its value, HTML-escaped, in one pass (a value is never read
   again as Markdown or HTML). A value in the target of an author's link is percent-encoded
   into the URL; a target that is a value alone must be an ``http(s)`` URL, or no link is made.

This is sound where escaping Markdown characters inside values is not: Markdown has no escape
that works everywhere (a backslash is literal inside a code span, where runbooks put node and
job names for commands to copy), and no escape stops a newline in a value from ending a list
item or a table row. Here a value cannot change the structure at all, whatever it contains.

The Markdown form (``?format=md``, the CLI, ``gpuwarden rules check``) is plain text with the
values verbatim; the collector serves it as ``text/markdown`` with ``nosniff``, so a browser shows
it as text. Whoever renders that text as Markdown must treat it as untrusted input.

A template error (syntax, undefined variable, sandbox violation, missing file) is a
:class:`RunbookError` naming the file and line, never a crash of the caller.
"""

from __future__ import annotations

import contextvars
import html
import re
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.runtime import Context
from jinja2.sandbox import SandboxedEnvironment
from markupsafe import Markup

from gpuwarden.collector.jobs.model import Job
from gpuwarden.collector.rules.model import Rule
from gpuwarden.collector.storage.base import ActionRecord
from gpuwarden.collector.storage.records import Incident, ModelDeployment

UNKNOWN = "unknown"


class RunbookError(Exception):
    """A runbook cannot be rendered; ``str()`` is ``<file>:<line>: <what is wrong>``."""


@dataclass(frozen=True, slots=True)
class Links:
    """Where things live, for messages and runbooks.

    Args:
        base_url: the collector's external URL (``https://gpuwarden.example``), no trailing /.
        runbook_base_url: serve rule runbooks from elsewhere (a wiki) instead of the collector.
        dashboard_base_url: Grafana's URL; dashboards are linked by their uid.
    """

    base_url: str = "http://127.0.0.1:4318"
    runbook_base_url: str | None = None
    dashboard_base_url: str | None = None

    def runbook_url(self, rule_id: str) -> str:
        """The rule's runbook (stable)."""
        base = (self.runbook_base_url or f"{self.base_url}/runbooks").rstrip("/")
        return f"{base}/{quote(rule_id, safe='')}"

    def incident_runbook_url(self, incident_id: int) -> str:
        """The runbook rendered with one incident's facts (stable)."""
        return f"{self.base_url}/incidents/{incident_id}/runbook"

    def incident_url(self, incident_id: int) -> str:
        """The incident's page (HTML, what a person opens from an alert; the JSON is at
        ``/v1/incidents/{id}`` with a token)."""
        return f"{self.base_url}/status/incidents/{incident_id}"

    def approval_url(self, token: str) -> str:
        """The confirmation page of an approval token (GET shows, POST approves)."""
        return f"{self.base_url}/approve/{quote(token, safe='')}"

    def dashboard_url(self, uid: str, variables: Mapping[str, str]) -> str:
        """A Grafana dashboard filtered on ``variables``; ``unknown`` without a Grafana URL."""
        if not self.dashboard_base_url:
            return UNKNOWN
        known = {k: v for k, v in variables.items() if v and v != UNKNOWN and v[0] != "<"}
        query = "&".join(f"var-{quote(k)}={quote(v)}" for k, v in known.items())
        base = self.dashboard_base_url.rstrip("/")
        return f"{base}/d/{quote(uid)}{'?' if query else ''}{query}"


def _text(value: object, key: str = "") -> str:
    if value is None or value == "":
        return UNKNOWN
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float) and key.endswith("_usd"):
        return f"{value:,.2f}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def _time(unix_seconds: float | None) -> str:
    if unix_seconds is None:
        return UNKNOWN
    return datetime.fromtimestamp(unix_seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class Evidence(dict[str, str]):
    """An incident's evidence as text; a key this detector does not report is ``unknown``
    (evidence differs per detector, the other variables have one shape and stay strict)."""

    def __missing__(self, key: str) -> str:
        return UNKNOWN


def _usd(value: object) -> str:
    return f"${value:,.2f}" if isinstance(value, int | float) else UNKNOWN


def runbook_context(
    rule: Rule | None,
    links: Links,
    *,
    incident: Incident | None = None,
    job: Job | None = None,
    model: ModelDeployment | None = None,
    actions: Sequence[ActionRecord] = (),
) -> dict[str, Any]:
    """The variables every runbook gets (one shape for all rules; unknown facts are
    ``"unknown"``). Without an incident, the facts are placeholders such as ``<job>``."""
    generic = incident is None
    ev: Mapping[str, Any] = incident.evidence if incident is not None else {}

    def fact(key: str, placeholder: str) -> str:
        return f"<{placeholder}>" if generic else _text(ev.get(key))

    job_key = job.key if job else ("<job>" if generic else _text(ev.get("job")))
    nodes = sorted({a.node for a in job.allocations}) if job else []
    node_name = fact("node", "node") if not nodes or ev.get("node") else nodes[0]
    model_name = model.name if model else fact("model", "model")
    dashboard_vars = {
        "job": job.key if job else str(ev.get("job") or ""),
        "node": str(ev.get("node") or (nodes[0] if nodes else "")),
    }
    rule_id = rule.id if rule else "<rule>"
    return {
        "rule": {
            "id": rule_id,
            "description": (rule.description or rule.id) if rule else "<description>",
            "severity": str(rule.severity) if rule else "<severity>",
            "owner": rule.owner if rule else "<owner>",
            "routes": list(rule.routes) if rule else [],
            "actions": [
                {"kind": a.kind, "mode": str(a.mode), "parameters": dict(a.parameters)}
                for a in (rule.actions if rule else ())
            ],
        },
        "incident": {
            "id": "<incident>" if incident is None else _text(incident.incident_id),
            "fingerprint": "<fingerprint>" if incident is None else incident.fingerprint,
            "state": "<state>" if incident is None else str(incident.state),
            "severity": "<severity>" if incident is None else incident.severity,
            "subject": fact("subject", "subject"),
            "summary": fact("summary", "summary"),
            "first_seen": "<time>" if incident is None else _time(incident.first_seen),
            "last_seen": "<time>" if incident is None else _time(incident.last_seen),
        },
        "job": {
            "key": job_key,
            "id": job.job_id if job else ("<job id>" if generic else UNKNOWN),
            "name": _text(job.name) if job else fact("job_name", "job name"),
            "owner": _text(job.owner) if job else fact("owner", "owner"),
            "team": _text(job.team) if job else fact("team", "team"),
            "gpus": _text(job.gpus) if job else fact("gpus", "GPUs"),
            "state": str(job.state) if job else fact("job_state", "state"),
            "scheduler": job.scheduler if job else fact("scheduler", "scheduler"),
            "nodes": ", ".join(nodes) if nodes else node_name,
            "price_tier": _text(job.price_tier) if job else fact("price_tier", "price tier"),
        },
        "gpu": {"id": fact("gpu", "GPU"), "node": node_name},
        "node": {"name": node_name},
        "model": {
            "name": model_name,
            "version": _text(model.version) if model else fact("version", "version"),
            "replicas": _text(model.replicas) if model else fact("replicas", "replicas"),
            "fallback": _text(model.fallback_model) if model else fact("fallback", "fallback"),
        },
        "cost": {
            "wasted_usd": "<$>" if generic else _usd(ev.get("wasted_usd")),
            "idle_gpu_hours": fact("idle_gpu_hours", "GPU-hours"),
            "price_tier": _text(job.price_tier) if job else fact("price_tier", "price tier"),
        },
        "evidence": Evidence({str(k): _text(v, str(k)) for k, v in sorted(ev.items())}),
        "has_incident": not generic,
        "actions": [
            {"kind": a.action, "target": a.target, "mode": a.mode, "state": a.state}
            for a in actions
        ],
        "links": {
            "runbook": links.runbook_url(rule_id),
            "incident": "<incident url>"
            if incident is None or incident.incident_id is None
            else links.incident_url(incident.incident_id),
            "fleet_dashboard": links.dashboard_url("gpuwarden-fleet", dashboard_vars),
            "serving_dashboard": links.dashboard_url("gpuwarden-serving", {"model": model_name}),
        },
    }


_SLOT_OPEN, _SLOT_CLOSE = "\ue000", "\ue001"
_SLOT = re.compile(f"{_SLOT_OPEN}([0-9]+){_SLOT_CLOSE}")
_NO_SLOT_MARKS = str.maketrans({_SLOT_OPEN: "\ufffd", _SLOT_CLOSE: "\ufffd"})
_SLOTS: contextvars.ContextVar[list[str]] = contextvars.ContextVar("runbook_slots")
"""The values set aside by the HTML rendering in progress (unset: Markdown, values verbatim)."""


@jinja2.pass_context  # needs the render, so Jinja never finalizes constants at compile time
def _set_aside(context: Context, value: object) -> object:
    """Jinja ``finalize``: during an HTML rendering, a printed value becomes a slot mark."""
    del context
    slots = _SLOTS.get(None)
    if slots is None:
        return value
    slots.append(str(value).translate(_NO_SLOT_MARKS))
    return f"{_SLOT_OPEN}{len(slots) - 1}{_SLOT_CLOSE}"


_FACTS = """
---

{% if has_incident -%}
## This incident
- Incident {{ incident.id }}: {{ incident.state }}, severity {{ incident.severity }}; first seen
  {{ incident.first_seen }}, last seen {{ incident.last_seen }}.
- Subject `{{ incident.subject }}`: {{ incident.summary }}
- Job `{{ job.key }}` ({{ job.name }}): owner {{ job.owner }}, team {{ job.team }},
  {{ job.gpus }} GPUs on {{ job.nodes }}, {{ job.state }}.
- Cost: {{ cost.wasted_usd }} wasted ({{ cost.idle_gpu_hours }} idle GPU-hours, price tier
  {{ cost.price_tier }}).

### Evidence
{% for key, value in evidence.items() %}- {{ key }}: {{ value }}
{% else %}- (no figures recorded)
{% endfor %}
{% endif -%}
### Actions taken or proposed
{% for a in actions %}- {{ a.kind }} on `{{ a.target }}` (mode {{ a.mode }}): {{ a.state }}
{% else %}{% for a in rule.actions %}- {{ a.kind }} (mode {{ a.mode }}): what the rule does
{% else %}- none: this alert only notifies
{% endfor %}{% endfor %}
### Links
- This runbook: {{ links.runbook }}
- Incident: {{ links.incident }}
- Fleet dashboard: {{ links.fleet_dashboard }}
- Serving dashboard: {{ links.serving_dashboard }}
"""
"""Appended to every runbook: the incident's facts, actions and links (one place for all rules,
so runbook files stay plain text with simple ``{{ a.b }}`` placeholders)."""

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="referrer" content="no-referrer">
<title>{{ title }}</title>
<link rel="stylesheet" href="/static/gpuwarden.css"></head>
<body class="doc">{{ body }}</body></html>
"""


class RunbookRenderer:
    """Renders the runbooks of one folder."""

    def __init__(self, runbooks_dir: Path) -> None:
        self.runbooks_dir = runbooks_dir
        self._env = SandboxedEnvironment(
            loader=jinja2.FileSystemLoader(str(runbooks_dir)),
            undefined=jinja2.StrictUndefined,
            autoescape=False,  # Markdown text: values are set aside for the HTML (see above)
            keep_trailing_newline=True,
            finalize=_set_aside,
        )
        self._page = SandboxedEnvironment(
            undefined=jinja2.StrictUndefined, autoescape=True
        ).from_string(_PAGE)
        self._facts = SandboxedEnvironment(
            undefined=jinja2.StrictUndefined,
            autoescape=False,  # Markdown text: values are set aside for the HTML (see above)
            keep_trailing_newline=True,
            finalize=_set_aside,
        ).from_string(_FACTS)

    def markdown(self, name: str, context: Mapping[str, Any]) -> str:
        """The runbook ``name`` (e.g. ``idle-gpu.md``) rendered as Markdown.

        Raises:
            RunbookError: missing file, syntax error, undefined variable, sandbox violation.
        """
        path = self.runbooks_dir / name
        try:
            template = self._env.get_template(name)
            text = template.render(dict(context))
        except jinja2.TemplateNotFound:
            raise RunbookError(f"{path}: no such runbook") from None
        except jinja2.TemplateSyntaxError as exc:
            raise RunbookError(f"{path}:{exc.lineno}: syntax error: {exc.message}") from None
        except jinja2.UndefinedError as exc:
            line = _template_line(exc, path)
            missing = self._undefined_name(name, exc, line)
            raise RunbookError(f"{path}:{line}: error: undefined name {missing}") from None
        except (jinja2.TemplateError, TypeError, ValueError, ArithmeticError) as exc:
            line = _template_line(exc, path)
            kind = "unsafe access" if isinstance(exc, SecurityError) else "error"
            raise RunbookError(f"{path}:{line}: {kind}: {exc}") from None
        try:
            return text.rstrip("\n") + "\n" + self._facts.render(dict(context))
        except (jinja2.TemplateError, TypeError, ValueError, KeyError) as exc:
            message = f"{path}: the context lacks what the facts section needs: {exc}"
            raise RunbookError(message) from None

    def _undefined_name(self, name: str, exc: jinja2.UndefinedError, line: str) -> str:
        """The dotted name that was undefined (``job.kee``), read back from the template's syntax
        tree at the failing line; Jinja's own message names only the last part."""
        match = _UNDEFINED.search(str(exc))
        if match is None:
            return f"({exc})"
        if match["name"] is not None:
            return match["name"]
        attr = match["attr"]
        try:
            source = self._env.loader.get_source(self._env, name)[0] if self._env.loader else ""
            tree = self._env.parse(source)
        except (jinja2.TemplateError, OSError):
            return attr
        for node in tree.find_all((nodes.Getattr, nodes.Getitem)):
            if isinstance(node, nodes.Getattr):
                key: object = node.attr
            elif isinstance(node, nodes.Getitem):
                key = _const(node.arg)
            else:
                continue
            if key == attr and str(node.lineno) in (line, "?"):
                return _dotted(node)
        return attr

    def html(self, name: str, context: Mapping[str, Any], *, title: str) -> str:
        """The runbook as a standalone HTML page: the author's Markdown converted, every value
        from the context escaped text (never Markdown, never HTML)."""
        values: list[str] = []
        reset = _SLOTS.set(values)
        try:
            text = self.markdown(name, context)
        finally:
            _SLOTS.reset(reset)
        body = markdown_to_html(text, values)
        return self._page.render(title=title, body=Markup(body))  # noqa: S704 - escaped above

    def check(self, rules: Iterable[Rule], links: Links) -> list[str]:
        """Render every rule's runbook with placeholder facts; return the problems."""
        problems = []
        for rule in rules:
            try:
                self.markdown(rule.runbook, runbook_context(rule, links))
            except RunbookError as exc:
                problems.append(f"rule {rule.id}: {exc}")
        return problems


_UNDEFINED = re.compile(r"has no attribute '(?P<attr>[^']*)'|^'(?P<name>[^']*)' is undefined")


def _const(node: nodes.Node) -> object:
    return node.value if isinstance(node, nodes.Const) else None


def _dotted(node: nodes.Node) -> str:
    """``job.kee`` for the expression ``job.kee`` (``job['kee']`` reads the same)."""
    if isinstance(node, nodes.Getattr):
        return f"{_dotted(node.node)}.{node.attr}"
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
        return f"{_dotted(node.node)}.{node.arg.value}"
    if isinstance(node, nodes.Name):
        return node.name
    return "(expression)"


def _template_line(exc: BaseException, path: Path) -> str:
    """The template line an exception was raised on (Jinja maps frames back to the file)."""
    lines = [
        frame.lineno
        for frame in traceback.extract_tb(exc.__traceback__)
        if frame.filename == str(path) or frame.filename.endswith(path.name)
    ]
    return str(lines[-1]) if lines and lines[-1] is not None else "?"


_INLINE = re.compile(r"`([^`]+)`|\*\*([^*]+)\*\*|\[([^\]]+)\]\(([^)\s]+)\)")
_SAFE_URL = re.compile(r"(https?://|/)[^\s\"'<>]*")
_VALUE_URL = re.compile(r"https?://[^\s\"'<>]*")


def _href(url: str, values: Sequence[str]) -> str | None:
    """The target of an author's link, or None for no link. A value that is the whole target
    must be an ``http(s)`` URL; a value inside the author's URL is percent-encoded."""
    whole = _SLOT.fullmatch(url)
    if whole is not None:
        value = _slot_value(whole, values)
        return value if _VALUE_URL.fullmatch(value) else None
    target = _SLOT.sub(lambda m: quote(_slot_value(m, values), safe=""), url)
    return target if _SAFE_URL.fullmatch(target) else None


def _slot_value(match: re.Match[str], values: Sequence[str]) -> str:
    index = int(match[1])
    return values[index] if index < len(values) else "\ufffd"


def _inline(text: str, values: Sequence[str]) -> str:
    out, last = [], 0
    for match in _INLINE.finditer(text):
        out.append(html.escape(text[last : match.start()]))
        code, bold, label, url = match.groups()
        href = None if url is None else _href(url, values)
        if code is not None:
            out.append(f"<code>{html.escape(code)}</code>")
        elif bold is not None:
            out.append(f"<strong>{html.escape(bold)}</strong>")
        elif href is not None:
            out.append(f'<a href="{html.escape(href)}">{html.escape(label)}</a>')
        else:
            out.append(html.escape(match.group(0)))
        last = match.end()
    out.append(html.escape(text[last:]))
    return "".join(out)


class _HtmlWriter:
    """Line-by-line Markdown to HTML for the subset runbooks use."""

    def __init__(self, values: Sequence[str]) -> None:
        self.values = values
        self.out: list[str] = []
        self.paragraph: list[str] = []
        self.block: str | None = None  # "ul", "ol" or "table"
        self.fence: list[str] | None = None

    def close_paragraph(self) -> None:
        if self.paragraph:
            self.out.append(f"<p>{' '.join(_inline(p, self.values) for p in self.paragraph)}</p>")
            self.paragraph.clear()

    def close_block(self) -> None:
        if self.block is not None:
            self.out.append(f"</{self.block}>")
            self.block = None

    def flush(self) -> None:
        self.close_paragraph()
        self.close_block()

    def open_block(self, tag: str) -> None:
        self.close_paragraph()
        if self.block != tag:
            self.close_block()
            self.out.append(f"<{tag}>")
            self.block = tag

    def code(self) -> None:
        self.out.append(f"<pre><code>{html.escape(chr(10).join(self.fence or []))}</code></pre>")
        self.fence = None

    def line(self, raw: str) -> None:
        stripped = raw.strip()
        if self.fence is not None:
            if stripped.startswith("```"):
                self.code()
            else:
                self.fence.append(raw)
            return
        heading = re.fullmatch(r"(#{1,6})\s+(.*)", stripped)
        item = re.fullmatch(r"([-*]|\d+\.)\s+(.*)", stripped)
        if stripped.startswith("```"):
            self.flush()
            self.fence = []
        elif heading:
            self.flush()
            level = len(heading.group(1))
            self.out.append(f"<h{level}>{_inline(heading.group(2), self.values)}</h{level}>")
        elif stripped.startswith("|"):
            self.open_block("table")
            cells = [c.strip() for c in stripped.strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                row = "".join(f"<td>{_inline(c, self.values)}</td>" for c in cells)
                self.out.append(f"<tr>{row}</tr>")
        elif item:
            self.open_block("ul" if item.group(1) in "-*" else "ol")
            self.out.append(f"<li>{_inline(item.group(2), self.values)}</li>")
        elif not stripped or stripped == "---":
            self.flush()
        elif self.block in ("ul", "ol") and raw.startswith((" ", "\t")):
            self.out[-1] = (
                f"{self.out[-1].removesuffix('</li>')} {_inline(stripped, self.values)}</li>"
            )
        else:
            self.close_block()
            self.paragraph.append(stripped)


def markdown_to_html(markdown: str, values: Sequence[str] = ()) -> str:
    """The subset of Markdown runbooks use: headings, lists, tables, fenced code, paragraphs,
    inline code, bold and links. Every piece of text is escaped; the slot marks of ``values``
    (set aside by :meth:`RunbookRenderer.html`) are replaced by the values, escaped, last."""
    writer = _HtmlWriter(values)
    for raw in markdown.splitlines():
        writer.line(raw.rstrip())
    if writer.fence is not None:
        writer.code()
    writer.flush()
    return _SLOT.sub(lambda m: html.escape(_slot_value(m, values)), "\n".join(writer.out))
