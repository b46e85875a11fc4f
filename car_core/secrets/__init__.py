"""Keeping secrets out of stored runs: the redactor and the forms it knows."""
