"""The feedback REST API: clients report how a response went; events go to `orl.feedback`."""
