"""``mailq-db dashboard``: a read-only web page of the queue (docs/monitoring/README.md).

:mod:`.data` is the only part that calls procedures; :mod:`.app` is a WSGI
application rendered with Jinja2 on the server (no JavaScript, no CDN).
"""
