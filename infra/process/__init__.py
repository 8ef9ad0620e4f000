"""The process room: what every Brain and Hands process starts with and runs by: the one settings
object (``settings``), the one logger setup (``logging``), traces (``tracing``), the commands'
first steps (``entry``), waiting for services at start (``startup``), kill points (``killpoints``),
the collector settings of a served process (``heap``), in-process listeners (``listeners``), the one
background loop of every scanner, relay and keeper (``loops``) and how a command reports an error
(``cli``)."""
