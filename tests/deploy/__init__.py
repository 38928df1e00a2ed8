"""Validation of the deployment files under deploy/: offline, with linters and schemas."""
