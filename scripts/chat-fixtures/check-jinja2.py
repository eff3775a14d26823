# Second opinion on the chat-template fixtures: re-renders every case of
# tests/chat/fixtures/templates.json with Python's Jinja2 set up the way
# transformers sets it up (sandbox, trim_blocks, lstrip_blocks, loopcontrols,
# tojson without ASCII escapes, raise_exception, strftime_now) and lists the
# cases where @huggingface/jinja's recorded outcome differs. Needs python3-jinja2.
#   python3 scripts/chat-fixtures/check-jinja2.py tests/chat/fixtures/templates.json
import json, sys
from datetime import datetime
import jinja2, jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

def raise_exception(message): raise jinja2.exceptions.TemplateError(message)
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = lambda f: datetime.now().strftime(f)

f = json.load(open(sys.argv[1]))
bad = 0
for c in f["cases"]:
    cfg = f["templates"][c["template"]]["config"]
    req = dict(f["conversations"][c["conversation"]])
    for k, v in cfg.items():
        if k == "chat_template" or k in req: continue
        req[k] = v if isinstance(v, str) else v["content"]
    req.setdefault("add_generation_prompt", c["add_generation_prompt"])
    try:
        got, err = env.from_string(cfg["chat_template"]).render(**req), None
    except Exception as e:
        got, err = None, str(e)
    same = (got == c.get("expected")) if "expected" in c else (err is not None)
    if not same:
        bad += 1
        print(c["template"], c["conversation"], c["add_generation_prompt"], "reference:", repr(c.get("expected", c.get("error")))[:200], "\n  jinja2:", repr(got if err is None else "ERR " + err)[:200])
print(len(f["cases"]), "cases,", bad, "differ from Jinja2")
