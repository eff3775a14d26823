# kiln-lm chat end to end: a tiny Llama pretrained for two iterations with the
# real Llama-2 tokenizer, given a chat template (chat_template.jinja, ending
# each assistant turn with </s>), then a piped conversation: every turn is
# answered, the second turn runs only the tokens the cache lacks, /reset
# starts afresh, and the turn's end token is found from the template.
#   cmake -DLM=kiln-lm -DCORPUS=dir -DTOKENIZER=dir -DWORK=dir -P chat_check.cmake
file(REMOVE_RECURSE ${WORK})
execute_process(COMMAND ${LM} pretrain --data ${CORPUS} --tokenizer ${TOKENIZER} --layers 1
                        --heads 2 --kv-heads 1 --intermediate 32 --hidden 16 --block 16 --batch 4
                        --warmup 1 --eval-windows 8 --threads 1 --iters 2 --eval-interval 2
                        --out ${WORK}/model --cache ${WORK}/corpus.tok
                RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pretrain failed (${rc}):\n${o}\n${e}")
endif()
file(WRITE ${WORK}/model/chat_template.jinja
     "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]"
     "{% else %} {{ m.content }}</s>{% endif %}{% endfor %}")
file(WRITE ${WORK}/conversation.txt "Hello there\nAnd a second turn\n/reset\nThird\n")
execute_process(COMMAND ${LM} chat --model ${WORK}/model --max-tokens 4 --ctx 128 --temperature 0 --threads 1
                INPUT_FILE ${WORK}/conversation.txt
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "chat failed (${rc}):\n${out}\n${err}")
endif()
message(STATUS "chat stderr:\n${err}")
if(NOT err MATCHES "turns end at ids 2\\)")
  message(FATAL_ERROR "the end of turn (</s>, id 2) was not found:\n${err}")
endif()
string(REGEX MATCHALL "prefill [0-9]+ tokens \\([0-9]+ cached\\)" turns "${err}")
list(LENGTH turns n)
if(NOT n EQUAL 3)
  message(FATAL_ERROR "expected 3 answered turns, got ${n}:\n${err}")
endif()
list(GET turns 0 t1)
list(GET turns 1 t2)
list(GET turns 2 t3)
if(NOT t1 MATCHES "\\(0 cached\\)" OR NOT t3 MATCHES "\\(0 cached\\)")
  message(FATAL_ERROR "the first turn and the turn after /reset must start afresh: ${turns}")
endif()
if(NOT t2 MATCHES "prefill ([0-9]+) tokens \\(([0-9]+) cached\\)")
  message(FATAL_ERROR "no second turn: ${turns}")
endif()
# The second turn reuses at least the first turn's prompt (10 tokens: the
# reply itself may tokenize otherwise once rendered as text).
if(CMAKE_MATCH_2 LESS 10)
  message(FATAL_ERROR "the second turn ran ${CMAKE_MATCH_1} tokens and reused ${CMAKE_MATCH_2}")
endif()
