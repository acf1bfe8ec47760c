"""The collector's HTTP side: the app and its routes, the guard, connection bounds, JSON
bounds, wire models, the login cookie, framing, settings, the server and its pid file."""
