"""Walk a URLconf's patterns: which routes are hot views, and the DRF reference of each."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver


def reference_patterns(patterns: list) -> list:
    """`patterns` with each hot_view callback replaced by `cls.as_view()`, names kept."""
    out: list = []
    for entry in patterns:
        if isinstance(entry, URLResolver):
            out.append(
                URLResolver(
                    entry.pattern,
                    reference_patterns(entry.url_patterns),
                    entry.default_kwargs,
                    entry.app_name,
                    entry.namespace,
                )
            )
        elif isinstance(entry, URLPattern) and hasattr(entry.callback, "dlock_hot_methods"):
            view = entry.callback.cls.as_view()
            out.append(URLPattern(entry.pattern, view, entry.default_args, entry.name))
        else:
            out.append(entry)
    return out


def hot_routes(patterns: list) -> list[str]:
    """The names of the routes served by a hot view."""
    names: list[str] = []
    for entry in patterns:
        if isinstance(entry, URLResolver):
            names.extend(hot_routes(entry.url_patterns))
        elif hasattr(entry.callback, "dlock_hot_methods"):
            names.append(entry.name)
    return names
