"""Scenarios as data (panels/data/*.jsonl), their schema and validation, and the frames that turn a
scenario into messages. No model code here.
"""
