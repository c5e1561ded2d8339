from services.legacy.celery import app


@app.event("legacy.thing.happened")
def thing_happened(value: str):
    pass


@app.event("legacy.number.even")
def number_is_even(number: int):
    if number % 2 != 0:
        raise ValueError(number)
