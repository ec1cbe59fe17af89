"""A thin client for the Argilla server the review stage talks to: the REST endpoints the SDK and the UI
use (`Connection`), plus the SDK where it is needed to create a dataset with the code's settings.

`ensure_dataset` finds or creates the review dataset (and refuses one whose settings differ from the
code); `push_records` upserts records in batches, resuming where an interrupted push stopped.
Errors become one-line `ReviewError`s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from clariedge.annotation import settings as S

if TYPE_CHECKING:
    from clariedge.annotation.review import ReviewConfig

log = logging.getLogger(__name__)


class ReviewError(ValueError):
    """A review problem worth one clear line: server down, wrong key, changed settings, missing export."""


@dataclass
class Connection:
    """An authenticated session with one Argilla server; errors become one-line `ReviewError`s."""

    url: str
    key: str
    timeout: float = 30.0
    me: dict[str, Any] = field(default_factory=dict)
    _http: Any = None

    @classmethod
    def open(cls, url: str | None, key: str | None, timeout: float = 30.0) -> Connection:
        if not url:
            raise ReviewError("no Argilla URL: set ARGILLA_API_URL (e.g. http://127.0.0.1:6900)")
        if not key:
            raise ReviewError("no Argilla API key: set ARGILLA_API_KEY (`clariedge review up` prints it)")
        import httpx

        for noisy in ("httpx", "argilla", "argilla.sdk"):  # one line per request / per settings object
            logging.getLogger(noisy).setLevel(logging.WARNING)
        conn = cls(url=url.rstrip("/"), key=key, timeout=timeout)
        conn._http = httpx.Client(base_url=conn.url, headers={"X-Argilla-Api-Key": key}, timeout=timeout)
        conn.me = conn.request("GET", "/api/v1/me")
        return conn

    def close(self) -> None:
        if self._http is not None:
            self._http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as err:
            raise ReviewError(
                f"Argilla at {self.url} did not answer within {self.timeout:g}s ({method} {path})"
            ) from err
        except httpx.TransportError as err:
            raise ReviewError(
                f"cannot reach Argilla at {self.url} ({err}); start it (`clariedge review up`) or fix ARGILLA_API_URL"
            ) from err
        if resp.status_code == 401:
            raise ReviewError(f"Argilla at {self.url} rejected the API key (check ARGILLA_API_KEY)")
        if resp.status_code == 403:
            raise ReviewError(
                f"the Argilla user {self.me.get('username', '?')!r} may not {method} {path}: use an owner or admin key"
            )
        if resp.status_code >= 400:
            raise ReviewError(f"Argilla {method} {path} failed with HTTP {resp.status_code}: {resp.text[:300]}")
        return resp.json() if resp.content else None

    def sdk(self) -> Any:
        """An `rg.Argilla` client for the same server (the SDK builds dataset settings)."""
        import argilla as rg

        try:
            return rg.Argilla(api_url=self.url, api_key=self.key, timeout=int(self.timeout))
        except Exception as err:  # the SDK raises its own and httpx errors here
            raise ReviewError(f"Argilla SDK could not connect to {self.url}: {err}") from err

    # ---- datasets -------------------------------------------------------------------------
    def workspace_id(self, name: str) -> str:
        for ws in self.request("GET", "/api/v1/me/workspaces")["items"]:
            if ws["name"] == name:
                return ws["id"]
        raise ReviewError(f"Argilla workspace {name!r} not found on {self.url} (review.workspace)")

    def find_dataset(self, name: str, workspace: str) -> dict[str, Any] | None:
        ws_id = self.workspace_id(workspace)
        for ds in self.request("GET", "/api/v1/me/datasets")["items"]:
            if ds["name"] == name and ds["workspace_id"] == ws_id:
                return ds
        return None

    def live_settings(self, dataset: dict[str, Any]) -> dict[str, Any]:
        """A live dataset's settings in `settings_spec` shape."""
        ds_id = dataset["id"]
        fields = [
            {"name": f["name"], "type": f["settings"]["type"]}
            for f in self.request("GET", f"/api/v1/datasets/{ds_id}/fields")["items"]
        ]
        questions = []
        for q in self.request("GET", f"/api/v1/datasets/{ds_id}/questions")["items"]:
            entry: dict[str, Any] = {"name": q["name"], "type": q["settings"]["type"]}
            options = [o["value"] for o in q["settings"].get("options") or []]
            if entry["type"] == "label_selection":
                entry["labels"] = options
            elif entry["type"] == "rating":
                entry["values"] = options
            questions.append(entry)
        metadata = [
            {"name": m["name"], "type": m["settings"]["type"]}
            for m in self.request("GET", f"/api/v1/me/datasets/{ds_id}/metadata-properties")["items"]
        ]
        return {
            "fields": fields,
            "questions": questions,
            "metadata": metadata,
            "distribution": dataset.get("distribution") or {},
        }

    def question_ids(self, dataset_id: str) -> dict[str, str]:
        return {q["name"]: q["id"] for q in self.request("GET", f"/api/v1/datasets/{dataset_id}/questions")["items"]}

    def usernames(self) -> dict[str, str]:
        return {u["id"]: u["username"] for u in self.request("GET", "/api/v1/users")["items"]}

    def list_records(self, dataset_id: str, include: Sequence[str] = (), page: int = 1000) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        offset = 0
        while True:
            params: list[tuple[str, Any]] = [("offset", offset), ("limit", page), *(("include", i) for i in include)]
            data = self.request("GET", f"/api/v1/datasets/{dataset_id}/records", params=params)
            out.extend(data["items"])
            offset += len(data["items"])
            if not data["items"] or offset >= data.get("total", offset):
                return out


def ensure_dataset(conn: Connection, name: str, cfg: ReviewConfig, *, create: bool = True) -> dict[str, Any]:
    """The live dataset `name`, created from `settings_spec` if missing; a dataset whose settings differ
    from the code is an error (settings cannot change after creation: bump `SETTINGS_VERSION`)."""
    role = conn.me.get("role")
    if role not in ("owner", "admin"):
        raise ReviewError(
            f"the Argilla user {conn.me.get('username', '?')!r} is an {role}: pushing and pulling need an owner "
            "or admin key (ARGILLA_API_KEY); use an owner or admin key"
        )
    spec = S.settings_spec(cfg.min_submitted)
    ds = conn.find_dataset(name, cfg.workspace)
    if ds is not None and ds.get("status") == "draft":
        # a creation that failed half way: it has no records yet, so it is safe to start it again
        log.warning("dataset %s was left half-created (draft); creating it again", name)
        conn.request("DELETE", f"/api/v1/datasets/{ds['id']}")
        ds = None
    if ds is None:
        if not create:
            raise ReviewError(f"dataset {name!r} not found in workspace {cfg.workspace!r} on {conn.url}: push first")
        import argilla as rg

        client = conn.sdk()
        try:
            rg.Dataset(
                name=name, workspace=cfg.workspace, settings=S.build_settings(spec, client), client=client
            ).create()
        except Exception as err:
            raise ReviewError(f"could not create dataset {name!r}: {err}") from err
        ds = conn.find_dataset(name, cfg.workspace)
        if ds is None:
            raise ReviewError(f"dataset {name!r} was created but cannot be found again")
        log.info("created dataset %s (min_submitted=%d)", name, cfg.min_submitted)
        return ds
    problems = S.settings_mismatch(spec, conn.live_settings(ds))
    if problems:
        raise ReviewError(
            f"dataset {name!r} on {conn.url} has other settings than this code ({'; '.join(problems)}): "
            "bump SETTINGS_VERSION in annotation/settings.py (a new dataset name) or delete the old dataset; "
            "nothing was changed"
        )
    return ds


def _api_record(record: dict[str, Any], question_ids: dict[str, str]) -> dict[str, Any]:
    sugg = []
    for s in record["suggestions"]:
        item = {"question_id": question_ids[s["question"]], "value": s["value"], "agent": s["agent"], "type": "model"}
        if s.get("score") is not None:
            item["score"] = s["score"]
        sugg.append(item)
    return {
        "external_id": record["external_id"],
        "fields": record["fields"],
        "metadata": record["metadata"],
        "suggestions": sugg,
    }


def push_records(
    conn: Connection,
    dataset: dict[str, Any],
    records: Sequence[dict[str, Any]],
    cfg: ReviewConfig,
    *,
    force: bool = False,
    progress: bool = True,
    on_batch: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Upsert records in batches (ids = example ids). Records whose content hash is already on the server
    are skipped unless `force`, so a re-run after a failure sends only what is missing. A batch the
    server refuses (HTTP 422) is retried one record at a time; refused records are counted and listed."""
    from tqdm import tqdm

    existing = {
        r["external_id"]: (r.get("metadata") or {}).get(S.META_PUSH_HASH)
        for r in conn.list_records(dataset["id"])
        if r.get("external_id")
    }
    todo = [r for r in records if force or existing.get(r["external_id"]) != r["metadata"][S.META_PUSH_HASH]]
    qids = conn.question_ids(dataset["id"])
    stats: dict[str, Any] = {
        "records": len(records),
        "skipped_unchanged": len(records) - len(todo),
        "created": sum(1 for r in todo if r["external_id"] not in existing),
        "updated": sum(1 for r in todo if r["external_id"] in existing),
        "sent": 0,
        "refused": [],
    }
    path = f"/api/v1/datasets/{dataset['id']}/records/bulk"
    bar = tqdm(total=len(todo), unit="rec", desc=f"push {dataset['name']}", disable=not progress or not todo)
    try:
        for start in range(0, len(todo), cfg.batch_size):
            batch = todo[start : start + cfg.batch_size]
            try:
                conn.request("PUT", path, json={"items": [_api_record(r, qids) for r in batch]})
            except ReviewError as err:
                if "HTTP 422" not in str(err):
                    raise ReviewError(
                        f"push to {dataset['name']!r} stopped after {stats['sent']} of {len(todo)} records: {err}. "
                        "Pushed records are kept; run the push again to send the rest"
                    ) from err
                for r in batch:  # find the refused record(s); the rest still go in
                    try:
                        conn.request("PUT", path, json={"items": [_api_record(r, qids)]})
                    except ReviewError as one:
                        if "HTTP 422" not in str(one):
                            raise
                        stats["refused"].append({"id": r["external_id"], "error": str(one)[:300]})
            stats["sent"] += len(batch)
            bar.update(len(batch))
            if on_batch is not None:
                on_batch(stats["sent"], len(todo))
    finally:
        bar.close()
    return stats
