# ruff: noqa
import os, sys, traceback, io, logging, warnings
from afterthought.settings import Settings, SettingsError

C = "CANARYx9q"
values = [
    C,
    "{" + C + "}",
    f"http://{C}",
    f"-1{C}",
    f'["{C}"]',
    f'{{"{C}": 1}}',
    f"{C}=1",
    f"redis://u:{C}@h:1/0",
    f"{C}:{C}",
    "1e999" + C,
    f"postgresql://u:{C}@/db?host=/x&port=a",
    f"{C}\n",
    f'{{"a": "{C}"}}',
    f'[1, "{C}"]',
]
leaks = 0
tried = 0
fields = list(Settings.model_fields)
env_names = [f"AFTERTHOUGHT_{f.upper()}" for f in fields] + [
    "REDIS_URL",
    "ZEP_API_KEY",
    "ZEP_BASE_URL",
    "DATABASE_URL",
]
logging.basicConfig(stream=(logbuf := io.StringIO()))
for name in env_names:
    for v in values:
        for k in list(os.environ):
            if k.startswith("AFTERTHOUGHT_") or k in (
                "REDIS_URL",
                "ZEP_API_KEY",
                "ZEP_BASE_URL",
                "DATABASE_URL",
            ):
                del os.environ[k]
        os.environ[name] = v
        tried += 1
        buf = io.StringIO()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            try:
                Settings()
                out = ""
            except Exception as e:
                out = "".join(traceback.format_exception(e))
            out += " ".join(str(x.message) for x in w)
        out += logbuf.getvalue()
        logbuf.truncate(0)
        logbuf.seek(0)
        if C in out:
            leaks += 1
            print("LEAK", name, repr(v), out.strip().splitlines()[-1][:300])
print("tried", tried, "leaks", leaks)
