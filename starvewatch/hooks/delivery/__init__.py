"""Delivery: from the step buffer to the collector. The shipper takes records from the buffer
(shipper.py), builds event batches and the book of exact totals (records.py), in the sidecar
process (sidecar.py, its link sidecar_link.py) or in this one, and sends them over HTTP or to
the spool (transport.py), finding or starting the collector first (collector_link.py).

Nothing here is imported by the hot path; the session (hooks/session.py) wires it up.
"""
