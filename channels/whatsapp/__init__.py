"""WhatsApp (Cloud API): verify, parse, admit, translate, send."""
