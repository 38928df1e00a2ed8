"""Helpers more than one backend uses and no backend owns; they import no client
library and no backend."""
