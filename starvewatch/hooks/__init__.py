"""The training-process side: everything that runs inside the process being watched.

Importing it imports only the standard library. The hot path (loader.py) imports nothing of
the session or of delivery (delivery/): it appends records in the layout of starvewatch/record_layout.py,
a contract shared with delivery, which reads them.
"""
