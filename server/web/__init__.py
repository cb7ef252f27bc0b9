"""The browser pages' files: HTML templates and the scripts built from web/ (server/api/web.py
serves them; docs/web.md)."""
