"""Stored values stay text in the dashboard (issue 36 item 1).

Dash renders a dict in a component's `children` that is shaped like a component
(`{"namespace", "type", "props"}`) as that component: a stall's `stack` sent as such an object
once became an `Iframe` whose script ran in the collector's origin. The wire model types every
field a view reads, so a stored value is a string or a number; this is the second wall, for a
database written before that (or any value a view passes on by mistake): every output of the
views goes through `inert`, which keeps real components (built here, in Python) and makes any
other object in their children its JSON text, shown as text.
"""
from __future__ import annotations

import json

from dash.development.base_component import Component


def inert(node):
    """`node` (a component tree, a list of them, or a plain value) with every child that is not
    a component, a string, a number or None replaced by its JSON text."""
    if isinstance(node, Component):
        children = getattr(node, "children", None)
        if children is not None:
            node.children = inert(children)
        return node
    if isinstance(node, (list, tuple)):
        return [inert(child) for child in node]
    if node is None or isinstance(node, (str, int, float)):
        return node
    return json.dumps(node, default=str, sort_keys=True)
