"""The words that mark a standing request ("from now on"), a mention ("in my novel",
"for homework") and someone who passes an order on to the user ("my manager", "the
form"), in the languages users speak. Data only, one phrase a line, written as people
write it: :mod:`afterthought.validation` folds each phrase to its normalised view and
compiles it. Orders themselves, in any language, are the classifier's to read
(:mod:`afterthought.classifier`).

Every list holds at least English, Chinese (simplified and traditional), Spanish, Hindi
(Devanagari and romanised), Arabic, Portuguese, Russian, Japanese, German, French, Korean,
Italian, Turkish, Indonesian, Malay, Vietnamese, Polish, Dutch, Ukrainian, Thai, Persian,
Hebrew, Bengali, Urdu, Swahili, Greek, Czech, Romanian, Tagalog and Swedish. A phrase
that is a common word's start or inside in another language is left out or written
whole ("my husband" as "mon mari": "mari" starts "Maria"); the view drops diacritics, so
"próxima" also matches "proxima"."""

from __future__ import annotations

FUTURE = """
desde ya
cada vez que
chaque fois que
jedes mal
ogni volta che
sempre que
каждый раз
每次
毎回
매번
كل مرة
हर बार
her seferinde
de ahora en más
para la próxima
d'ora in avanti
for all our sessions
for all our chats
for all our conversations
for all future
in all sessions
every session
zukünftig
bei allen zukünftigen
a partir de hoy
desde hoy
a partir de hoje
desde hoje
dès aujourd'hui
à compter de maintenant
ab heute
da oggi
a partire da ora
с сегодняшнего дня
从今天起
从今以后
今日から
오늘부터
من اليوم
आज से
bugünden itibaren
from this point on
from today
upcoming conversations
upcoming chats
later chats
later conversations
next session
next conversation
next chat
future session
every future
from now on
next time
for the rest of our
in future sessions
in future chats
in future conversations
in all future
in all our future
in every future
going forward
henceforth
de ahora en adelante
a partir de ahora
desde ahora
la próxima vez
en las próximas
en adelante
en el futuro
el resto de nuestras
à partir de maintenant
désormais
dorénavant
la prochaine fois
à l'avenir
pour le reste de nos
lors des prochaines
ab jetzt
von nun an
ab sofort
künftig
in zukunft
beim nächsten mal
nächstes mal
für den rest unserer
in allen zukünftigen
d'ora in poi
da ora in poi
da adesso
la prossima volta
in futuro
per il resto delle nostre
nelle prossime
de agora em diante
a partir de agora
da próxima vez
na próxima vez
no futuro
no resto das nossas
nas próximas
с этого момента
отныне
теперь всегда
в следующий раз
в будущем
во всех будущих
в будущих
впредь
从现在开始
从现在起
今后
以后
下次
在以后的
在今后的
将来
これからは
今後
次に
次回
今から
以降
지금부터
앞으로
다음에
다음부터
이제부터
من الآن فصاعدا
من الآن
في المرة القادمة
في المستقبل
في المحادثات القادمة
अब से
अगली बार
भविष्य में
आगे से
bundan sonra
artık
bir dahaki sefere
gelecekte
sonraki sohbet
from here on
from here on out
from this moment on
from this point forward
from this point onward
from now onwards
from now onward
starting now
starting today
from today on
moving forward
for future chats
de aquí en adelante
de hoy en adelante
a partir de este momento
desde este momento
en lo sucesivo
la siguiente vez
pa la próxima
en futuras conversaciones
en las siguientes conversaciones
en todas nuestras conversaciones
doravante
daqui pra frente
daqui para frente
daqui em diante
de hoje em diante
de agora pra frente
a partir deste momento
toda vez que
na próxima conversa
nas próximas conversas
em conversas futuras
dès maintenant
dès à présent
à partir d'aujourd'hui
à partir de ce moment
à chaque fois que
les prochaines fois
prochaine conversation
prochaines conversations
prochaine discussion
dans nos futures conversations
pour toutes nos conversations
von jetzt an
ab nun
fortan
hinfort
ab diesem moment
ab diesem zeitpunkt
ab dem jetzigen zeitpunkt
das nächste mal
naechstes mal
beim naechsten mal
kuenftig
zukuenftig
in kuenftigen
jedesmal
in künftigen
für die zukunft
d'ora innanzi
dora in poi
dora in avanti
da qui in avanti
a partire da adesso
a partire da questo momento
da questo momento
la prox volta
la prossima conversazione
nelle conversazioni future
in tutte le nostre conversazioni
с этих пор
с этого дня
в дальнейшем
в следующем чате
в следующем разговоре
в следующих чатах
в следующих разговорах
в след раз
впредь всегда
從現在開始
從現在起
從今天起
從今以後
以後
將來
下一次
在以後的
往后
往後
次から
今度から
これから先
これ以降
次の会話
今後の会話
이제부턴
지금부턴
다음부턴
앞으론
다음번에
담부터
향후
이후로
다음 대화
bundan böyle
bundan itibaren
şu andan itibaren
bi dahaki
bir sonraki sefer
sonraki konuşma
gelecekteki sohbet
her sohbette
mulai sekarang
mulai saat ini
mulai hari ini
mulai dari sekarang
mulai skrg
dari sekarang
dari skrg
ke depannya
kedepannya
lain kali
di masa depan
setiap kali
tiap kali
percakapan berikutnya
obrolan berikutnya
chat berikutnya
untuk seterusnya
lepas ni
lepas ini
selepas ini
mulai dari hari ini
pada masa hadapan
masa akan datang
perbualan seterusnya
perbualan akan datang
từ giờ
từ giờ trở đi
từ nay
từ nay về sau
từ bây giờ
kể từ bây giờ
kể từ nay
lần sau
lần tới
lần tiếp theo
sau này
trong tương lai
mỗi lần
mỗi khi
cuộc trò chuyện tiếp theo
od teraz
od dziś
od dzisiaj
od tej pory
od tego momentu
od tej chwili
odtąd
na przyszłość
w przyszłości
następnym razem
za każdym razem
w kolejnych rozmowach
w następnych rozmowach
w każdej rozmowie
vanaf nu
vanaf vandaag
vanaf heden
van nu af aan
voortaan
in de toekomst
volgende keer
elke keer
iedere keer
telkens als
telkens wanneer
in toekomstige gesprekken
in alle gesprekken
volgend gesprek
відтепер
віднині
з цього моменту
з цього часу
з сьогодні
з сьогоднішнього дня
наступного разу
у майбутньому
в майбутньому
надалі
щоразу
кожного разу
у наступних розмовах
в наступних розмовах
у всіх майбутніх
тепер завжди
ต่อจากนี้
จากนี้ไป
นับจากนี้
ตั้งแต่นี้
ตั้งแต่วันนี้
ครั้งหน้า
ครั้งต่อไป
คราวหน้า
ในอนาคต
ทุกครั้ง
از این به بعد
از اين به بعد
از الان به بعد
از حالا به بعد
از حالا
از الان
از امروز
از این پس
منبعد
دفعه بعد
دفعه ی بعد
دفعه دیگه
بار بعد
در آینده
در آينده
هر بار
هر دفعه
مستقبلا
بعد الآن
المرة القادمة
المرة الجاية
من هلأ
من هلق
من دلوقتي
من هنا ورايح
في كل محادثة
في جميع المحادثات
מעכשיו
מעתה
מהיום
מכאן והלאה
להבא
בפעם הבאה
פעם הבאה
בעתיד
בכל פעם
בשיחה הבאה
בשיחות הבאות
अब के बाद
आज के बाद
इसके बाद से
आगे चलकर
ab se aap
ab se tum
ab se hamesha
ab se har
aaj se
aaj ke baad
ab ke baad
agli baar
agli bar
aage se
har baar
bhavishya mein
এখন থেকে
আজ থেকে
পরের বার
পরেরবার
ভবিষ্যতে
প্রতিবার
এরপর থেকে
এর পর থেকে
আগামীতে
ekhon theke
اب سے
آج سے
آئندہ
آیندہ
اگلی بار
اگلی دفعہ
مستقبل میں
ہر بار
ہر دفعہ
اب کے بعد
اس کے بعد سے
kuanzia sasa
kuanzia leo
tangu sasa
tangu leo
wakati ujao
mara ijayo
siku zijazo
mazungumzo yajayo
από εδώ και πέρα
από δω και πέρα
από δω και μπρος
από τώρα
στο εξής
εφεξής
την επόμενη φορά
επόμενη φορά
στο μέλλον
κάθε φορά
από σήμερα
στην επόμενη συζήτηση
στις επόμενες συζητήσεις
apo tora
apo edw kai pera
apo edo kai pera
tin epomeni fora
od teď
odteď
od teďka
od nynějška
od dneška
od této chvíle
příště
napříště
v budoucnu
pokaždé
v dalších konverzacích
v příští konverzaci
de acum înainte
de acum încolo
de azi înainte
data viitoare
pe viitor
în viitor
de fiecare dată
în conversațiile viitoare
mula ngayon
simula ngayon
magmula ngayon
mula ngayong araw
simula ngayong araw
sa susunod
sa hinaharap
sa bawat pagkakataon
sa mga susunod na usapan
från och med nu
från och med idag
från och med i dag
från nu
hädanefter
framöver
i fortsättningen
nästa gång
i framtiden
varje gång
i kommande samtal
i framtida samtal
de-acum înainte
începând de acum
începând de azi
începând de astăzi
"""

MENTION_CUES = """
titled
entitled
subject line
with the subject
polish
proofread
rephrase
reword
rewrite
draft
does that sound
does this sound
corrige
revisa
korrigier
überarbeite
correggi
play
whisper
murmur
exclaim
explain
explic
erklär
spiega
объясн
解释
説明
설명
شرح
समझा
anlat
tradu
перевод
prompt
injection
inyección
attack
ataque
attaque
angriff
attacco
атак
攻击
注入
攻撃
インジェクション
인젝션
공격
هجوم
हमला
saldırı
frase
satz
ifade
cümle
عبارة
वाक्य
表現
표현
teacher
老师
先生
선생님
المعلم
शिक्षक
öğretmen
учител
aula
articol
artigo
exempl
esempi
ejemplo
пример
стать
scriv
escrev
escrib
écri
schreib
estud
studi
étudi
изуча
novel
story
stories
book
screenplay
script
character
villain
hero
npc
game
poem
song
film
movie
scene
says
said
say
saying
shouting
shouts
writes
wrote
written
typing
typed
translate
translation
homework
class
lesson
teacher
course
exam
article
news
paper
essay
thesis
report
reading
read
quote
quoting
cited
phrase
sentence
means
meaning
how do you say
example
like
such as
phishing
scam
joke
meme
sign
form
poster
learning
novela
cuento
historia
personaje
dice
dijo
frase
traducir
traduce
tarea
significa
aprendiendo
artículo
roman
histoire
personnage
dit
traduire
devoir
signifie
geschichte
figur
sagt
satz
übersetz
hausaufgabe
bedeutet
artikel
romanzo
personaggio
tradurre
compito
significa
romance
personagem
traduzir
роман
рассказ
персонаж
говорит
фраза
перевести
по-английски
статья
статьи
домашн
小说
故事
角色
翻译
作业
论文
引用
文章
意思
这句话
小説
物語
キャラ
叫ぶ
翻訳
宿題
論文
記事
意味
場面
소설
이야기
캐릭터
번역
숙제
기사
의미
رواية
قصة
ترجم
واجب
مقال
उपन्यास
कहानी
अनुवाद
roman
hikaye
çevir
ödev
makale
przetłumacz
tłumacz
dịch
terjemah
vertaal
översätt
переклад
lyrics
dialogue
transcript
subtitles
quiz
textbook
worksheet
assignment
lecture
小說
翻譯
作業
這句話
解釋
老師
剧本
劇本
台词
台詞
例句
例子
举例
舉例
课文
課文
考试
考試
电影
電影
诗歌
詩歌
歌词
歌詞
怎么说
怎麼說
说道
說道
poema
canción
película
libro
guion
escena
ensayo
relato
cómo se dice
किताब
कविता
फिल्म
उदाहरण
का मतलब
होमवर्क
गृहकार्य
निबंध
लेख
किरदार
ने कहा
कैसे कहते
कक्षा
kahani
kitab
kitaab
kavita
anuvad
ka matlab
ne kaha
كتاب
قصيدة
فيلم
أغنية
شخصية
مشهد
جملة
مثال
معنى
اقتباس
امتحان
تمرين
قالت
كيف تقول
كيف أقول
بالإنجليزية
livro
canção
filme
conto
roteiro
dever de casa
redação
citação
disse
como se diz
книг
стих
песн
фильм
сцен
сценари
эссе
сочинени
урок
экзамен
цитат
сказал
написал
означает
как сказать
предложени
выражени
переведи
задани
лекци
учебник
преподавател
映画
ゲーム
セリフ
脚本
例文
例えば
作文
授業
試験
と言った
って言った
と書いて
英語で
何て言う
なんて言う
訳して
漫画
マンガ
アニメ
ドラマ
buch
gedicht
lied
spiel
szene
drehbuch
aufsatz
zitat
zitier
beispiel
unterricht
prüfung
uebersetz
erklaer
sagte
schrieb
wie sagt man
auf englisch
bedeutung
ausdruck
redewendung
erzählung
livre
poème
chanson
scène
scénario
dissertation
rédaction
citation
leçon
examen
a dit
comment dit-on
comment on dit
en anglais
expression
conte
réplique
노래
가사
영화
게임
대본
장면
예문
예를 들어
예시
에세이
작문
수업
시험
인용
라고 했
라고 말했
영어로
이 문장
문장
드라마
웹툰
만화
poesia
canzone
gioco
scena
copione
sceneggiatura
saggio
citazione
lezione
esame
ha detto
come si dice
in inglese
racconto
storia
favola
kitap
şiir
şarkı
oyun
sahne
senaryo
karakter
kompozisyon
alıntı
örnek
ders
sınav
diyor
yazdı
nasıl denir
ingilizce
anlamı
ne demek
tercüme
cerita
buku
puisi
lagu
permainan
tokoh
adegan
naskah
skenario
tugas sekolah
pekerjaan rumah
esai
kutipan
kalimat
contoh
artinya
guru
pelajaran
ujian
berkata
mengatakan
dalam bahasa
filem
watak
skrip
kerja rumah
kerja sekolah
karangan
petikan
maksudnya
cikgu
peperiksaan
katanya
tiểu thuyết
câu chuyện
cuốn sách
bài thơ
bài hát
phim
trò chơi
nhân vật
kịch bản
bài tập
bài luận
bài báo
bài viết
trích dẫn
câu này
ví dụ
nghĩa là
có nghĩa
giáo viên
cô giáo
thầy giáo
bài học
lớp học
kỳ thi
bài kiểm tra
nói rằng
tiếng anh
nói thế nào
giải thích
powieść
opowiadani
książk
wiersz
piosenk
postać
scen
esej
artykuł
cytat
przykład
oznacza
nauczyciel
lekcj
zadanie domowe
pracę domową
prace domowe
egzamin
powiedział
jak się mówi
jak powiedzieć
po angielsku
wyjaśnij
wytłumacz
verhaal
boek
liedje
spel
personage
huiswerk
opstel
citaat
deze zin
voorbeeld
betekent
leraar
lerares
klas
toets
zei
zegt
schreef
hoe zeg je
in het engels
uitleggen
leg uit
оповідання
історі
вірш
пісн
фільм
сценарі
есе
стаття
статті
речення
приклад
означає
вчител
викладач
іспит
сказав
сказала
як сказати
англійською
поясн
นิยาย
เรื่องสั้น
นิทาน
หนังสือ
บทกวี
กลอน
เพลง
ภาพยนตร์
เกม
ตัวละคร
บทพูด
แปลว่า
แปลเป็น
การบ้าน
เรียงความ
บทความ
คำพูด
ประโยค
ตัวอย่าง
หมายถึง
ความหมาย
อาจารย์
บทเรียน
ชั้นเรียน
พูดว่า
บอกว่า
ภาษาอังกฤษ
อธิบาย
رمان
داستان
کتاب
آهنگ
فیلم
شخصیت
صحنه
فیلمنامه
ترجمه
تکلیف
مقاله
نقل قول
جمله
معنی
به معنای
معلم
استاد
گفت
توضیح
به انگلیسی
רומן
סיפור
סרט
דמות
סצנה
תסריט
תרגם
תרגום
שיעורי בית
מאמר
כתבה
ציטוט
משפט
דוגמה
דוגמא
פירוש
מורה
שיעור
מבחן
איך אומרים
באנגלית
להסביר
תסביר
উপন্যাস
গল্প
কবিতা
সিনেমা
চরিত্র
দৃশ্য
অনুবাদ
বাড়ির কাজ
হোমওয়ার্ক
রচনা
প্রবন্ধ
উদ্ধৃতি
বাক্য
উদাহরণ
মানে
শিক্ষক
পরীক্ষা
বলেছে
কিভাবে বলে
ইংরেজিতে
ব্যাখ্যা
کہانی
گانا
فلم
کردار
منظر
ترجمہ
ہوم ورک
مضمون
جملہ
مطلب
ٹیچر
نے کہا
کیسے کہتے
انگریزی میں
سمجھاؤ
وضاحت
riwaya
hadithi
kitabu
shairi
wimbo
filamu
mchezo
mhusika
tafsiri
kazi ya nyumbani
makala
nukuu
sentensi
mfano
maana yake
inamaanisha
mwalimu
darasa
mtihani
alisema
anasema
kwa kiingereza
eleza
μυθιστόρημα
ιστορία
βιβλίο
ποίημα
τραγούδι
ταινία
παιχνίδι
χαρακτήρα
σκηνή
σενάριο
μετάφρασ
μετάφρασε
έκθεση
άρθρο
απόσπασμα
φράση
πρόταση
παράδειγμα
σημαίνει
δάσκαλ
καθηγητ
μάθημα
είπε
λέει
πώς λέγεται
πώς λέμε
στα αγγλικά
εξήγησ
povídk
příběh
knih
báseň
písn
scénář
přelož
překlad
domácí úkol
úkol
sloh
článek
citát
věta
příklad
znamená
učitel
lekc
zkoušk
řekl
jak se řekne
anglicky
vysvětli
poveste
povestire
poezi
cântec
personaj
scenariu
eseu
compunere
citat
propoziți
frază
înseamnă
profesoara
lecți
a spus
a zis
cum se spune
în engleză
nobela
kuwento
tula
kanta
pelikula
laro
tauhan
eksena
isalin
takdang-aralin
takdang aralin
sanaysay
artikulo
pangungusap
halimbawa
ibig sabihin
titser
leksyon
aralin
pagsusulit
sabi niya
sinabi
paano sabihin
sa ingles
ipaliwanag
berättelse
novell
bok
boken
dikt
karaktär
manus
läxa
läxor
uppsats
mening
betyder
lärare
lektion
säger
skrev
hur säger man
på engelska
förklara
dedi ki
to zdanie
"""

REPORTERS = """
daughter
son
kid
grandma
grandpa
granny
aunt
uncle
cousin
neighbour
neighbor
partner
girlfriend
boyfriend
roommate
flatmate
villain
hero
robot
character
hacker
attacker
scammer
pirate
npc
narrator
protagonist
article
post
prof
profe
maestro
maestra
manager
boss
teacher
professor
lecturer
doctor
mum
mom
dad
mother
father
wife
husband
colleague
coworker
friend
landlord
coach
supervisor
instructor
sister
brother
form
recipe
sign
manual
leaflet
letter
email
website
page
label
guide
memo
notice
handbook
document
doc
policy
contract
jefe
jefa
profesor
profesora
médico
formulario
receta
chef
professeur
médecin
formulaire
recette
chef
lehrer
lehrerin
arzt
formular
rezept
mamá
papá
madre
padre
esposa
esposo
marido
hermana
hermano
amigo
amiga
compañero
compañera
père
maman
papa
femme
soeur
frère
ami
amie
collègue
patron
mutter
vater
mama
frau
schwester
bruder
freund
freundin
kollege
kollegin
chefin
moglie
marito
sorella
fratello
amico
amica
collega
capo
medico
modulo
mãe
pai
irmã
irmão
colega
chefe
formulário
мама
папа
мать
отец
жена
муж
сестра
брат
подруга
коллега
начальни
босс
учитель
врач
тато
дружина
чоловік
колега
妈妈
我妈
爸爸
我爸
老板
老闆
老师
老師
朋友
同事
老婆
老公
医生
醫生
经理
經理
领导
領導
姐姐
哥哥
弟弟
妹妹
儿子
兒子
女儿
女兒
表格
お母さん
お父さん
ママ
パパ
上司
友達
同僚
妻
医者
部長
課長
엄마
아빠
어머니
아버지
상사
사장님
팀장님
친구
동료
아내
남편
언니
오빠
누나
형이
annem
babam
patronum
müdürüm
öğretmenim
arkadaşım
eşim
kocam
karım
ablam
abim
doktor
ibu
ayah
bapak
bos
atasan
teman
temanku
istri
suami
kakak
adik
dosen
dokter
emak
mak
abah
kawan
isteri
majikan
mẹ tôi
bố tôi
ba tôi
sếp
đồng nghiệp
vợ
chồng
bạn tôi
chị tôi
anh tôi
bác sĩ
tata
szef
szefowa
kolega
koleżanka
mąż
siostra
brat
przyjaciel
lekarz
moeder
vader
baas
vrouw
vriend
vriendin
zus
broer
leraar
начальник
керівник
вчитель
лікар
เจ้านาย
หัวหน้า
เพื่อน
เพื่อนร่วมงาน
ภรรยา
แฟน
مادرم
پدرم
رئیسم
دوستم
همکارم
همسرم
معلمم
دکتر
مديري
صديقي
صديقتي
زميلي
زوجتي
زوجي
الطبيب
אמא שלי
אבא שלי
הבוס
המנהל
חבר שלי
חברה שלי
אשתי
בעלי
הרופא
המורה
मम्मी
पापा
बॉस
मैनेजर
दोस्त
पत्नी
पति
डॉक्टर
टीचर
mummy
mummy ne
mere boss
বাবা
বন্ধু
স্ত্রী
স্বামী
ডাক্তার
دوست
بیوی
شوہر
mama yangu
baba yangu
bosi
rafiki
mke wangu
mume wangu
daktari
η μαμά
ο μπαμπάς
η μητέρα
ο πατέρας
το αφεντικό
ο φίλος
η φίλη
η γυναίκα μου
ο άντρας μου
ο γιατρός
máma
táta
šéf
šéfová
kamarád
kamarádka
manželka
manžel
lékař
șeful
șefa
prietenul
prietena
soția
soțul
colegul
medicul
nanay
tatay
kaibigan
asawa
kuya
mamma
pappa
chefen
kompis
fru
kollega
läkare
mon mari
mein mann
мой друг
moja żona
แม่ฉัน
แม่ผม
แม่บอก
พ่อฉัน
พ่อผม
พ่อบอก
สามีฉัน
ماما
بابا
والدتي
والدي
ma mère
"""

#: The one spoken to as "you", in the languages users speak: with :data:`ASSISTANT`, whom
#: a clause addresses (an order to the agent says "you"; a story or a report says "she").
YOU = """
you
your
yours
yourself
u
ur
tu
ti
usted
ustedes
vous
votre
toi
ton
du
dich
dir
dein
deine
deinen
jij
jou
jouw
ty
ciebie
cie
tobie
twoj
twoje
sen
seni
sana
senin
kamu
anda
kau
tum
tumhe
aap
voce
teu
tua
tuo
ты
тебя
тебе
твой
твои
вы
вас
вам
ваш
ти
твоє
你
您
あなた
君
お前
네가
당신
니가
أنت
انت
لك
تو
شما
אתה
לך
คุณ
เธอ
आप
तुम
yourselves
te
tus
tuyo
contigo
vos
vosotros
tes
t'
toi-même
deinem
deiner
euch
euer
tuoi
voi
vostro
vostra
vc
vcs
vocês
seu
sua
seus
suas
tobą
wy
wasz
twoja
тобой
тобою
твое
твоя
твою
твоего
твоих
ваша
ваше
ваши
вашего
вашей
вами
тобі
твій
твої
ви
siz
sizin
sizi
seninle
sende
engkau
lu
awak
korang
kalian
bạn
các bạn
妳
你们
你們
あんた
おまえ
きみ
貴方
너는
너의
너를
너한테
너가
넌
너희
너도
당신은
نفسك
لديك
عندك
حضرتك
خودت
شماها
שלך
אותך
עצמך
אתם
בשבילך
तुम्हारा
तुम्हें
तुम्हारी
आपका
आपकी
आपको
tumhara
tumhari
tumko
tujhe
aapka
aapki
aapko
aapne
তুমি
তোমার
তোমাকে
আপনি
আপনার
আপনাকে
তোর
تمہیں
تمہارا
تمہاری
آپ کا
آپ کی
آپ کو
آپ نے
آپ سے
wewe
nyinyi
ninyi
yako
wako
lako
kwako
εσύ
εσένα
σου
σας
εσείς
tebe
tobě
tvůj
tvoje
tvá
vy
vás
vám
váš
vaše
tine
îți
tău
dumneavoastră
vouă
ikaw
kayo
ninyo
iyo
iyong
mo
dig
din
ditt
dina
jullie
uw
jezelf
"""

#: Words that name the agent itself (or its makers' settings) rather than a person.
ASSISTANT = """
assistant
ai
bot
chatbot
model
llm
gpt
system
agent
asistente
assistente
asystent
assistent
asisten
ia
ki
ии
бот
ассистент
помощник
助手
助理
人工智能
アシスタント
ボット
어시스턴트
챗봇
المساعد
ذكاء اصطناعي
trợ lý
yapay zeka
सहायक
chatgpt
copilot
l'ia
l'assistant
la ia
人工智慧
人工知能
チャットボット
인공지능
нейросеть
нейросети
нейронк
чат-бот
ші
асистент
помічник
нейромереж
asystentka
sztuczna inteligencja
asistan
kecerdasan buatan
kecerdasan artifisial
trí tuệ nhân tạo
ผู้ช่วย
บอท
ปัญญาประดิษฐ์
เอไอ
دستیار
هوش مصنوعی
مساعد
الذكاء الاصطناعي
בינה מלאכותית
העוזר
צ'אטבוט
असिस्टेंट
एआई
बॉट
कृत्रिम बुद्धिमत्ता
সহকারী
এআই
বট
اسسٹنٹ
اے آئی
مصنوعی ذہانت
msaidizi
akili bandia
βοηθός
τεχνητή νοημοσύνη
asistent
umělá inteligence
asistentul
inteligența artificială
inteligencia artificial
inteligência artificial
intelligence artificielle
künstliche intelligenz
intelligenza artificiale
artificial intelligence
kunstmatige intelligentie
yapay zekâ
katulong
聊天机器人
聊天機器人
бота
боту
ботом
боты
dell'ia
all'ia
sull'ia
nell'ia
"""

#: The speaker as the subject ("I", "my"): what people say about their own life.
SELF = """
i
i'm
im
my
me
je
j'
moi
mon
ma
ich
mein
meine
mir
mich
yo
mi
eu
meu
minha
io
mio
ik
mijn
ja
moj
moja
jag
min
ben
benim
aku
saya
mình
tôi
я
мой
моя
мне
меня
我
私
僕
내가
제가
أنا
من
אני
ฉัน
मेरा
मेरी
myself
mine
mis
conmigo
meus
minhas
comigo
mim
m'
mia
miei
me stesso
mij
mezelf
mnie
moje
mną
мои
мое
моего
моей
моих
моим
мной
мною
мій
мене
мені
мої
моє
bana
beni
bende
kendim
gue
gua
俺
わたし
あたし
ぼく
나는
나의
나를
나한테
저는
저의
저를
저도
عندي
خودم
שלי
אותי
עצמי
ผม
मुझे
मुझको
मेरे
मैंने
mujhe
mujhko
mainne
maine
আমি
আমার
আমাকে
مجھے
میرا
میری
mimi
yangu
wangu
changu
εγώ
μου
εμένα
já
mě
mně
můj
mie
mea
ako
ko
akin
mig
mina
"""

#: Words that turn a message to a new matter ("btw", "anyway", "oh and"): a clause starts
#: after them, as after a full stop.
TURNS = """
btw
by the way
anyway
anyways
oh and
oh also
also
plus
ps
p.s.
por cierto
au fait
à propos
übrigens
кстати
а ещё
对了
顺便
ところで
あと
그리고
아 그리고
trouwens
oh iya
à mà
ว่าแต่
a propósito
aliás
comunque
tra l'altro
oh btw
by the by
speaking of which
bu arada
neyse
przy okazji
swoją drogą
a tak w ogóle
до речі
а ще
بالمناسبة
على فكرة
راستی
در ضمن
דרך אגב
אגב
בכל מקרה
waise
vaise
वैसे भी
যাই হোক
ভালো কথা
ویسے
بہرحال
hata hivyo
παρεμπιπτόντως
παρεπιπτόντως
τέλος πάντων
mimochodem
a ještě
apropo
oricum
nga pala
siyanga pala
förresten
för övrigt
hursomhelst
ngomong-ngomong
omong-omong
oh ya
nhân tiện
tiện thể
そういえば
ちなみに
그나저나
아 맞다
话说
對了
順便
另外
d'ailleurs
bref
ach ja
nebenbei
apropos
a proposito
кстати говоря
короче
"""

#: Verbs said to the agent as orders (imperatives, "you are now"): a cue the classifier
#: weighs with whom the clause addresses, not a rule by itself ("I ignored my alarm").
ORDERS = """
ignore
disregard
forget
reveal
show me your
print your
repeat your
pretend
act as
never mention
don't mention
do not mention
don't tell
never tell
stop warning
always recommend
reply with
respond with
answer only
you are now
you're now
stay in character
turn off
ignora
olvida
muéstrame
revela
finge
actúa como
nunca menciones
no menciones
no le digas
nunca digas
recomienda
envía
contéstame
respóndeme
desactiva
ahora eres
oublie
montre-moi
révèle
affiche
fais semblant
agis comme
ne mentionne
ne dis jamais
recommande
envoie
réponds
désactive
tu es maintenant
tu es désormais
ignoriere
vergiss
zeig mir
verrate
tu so
tu einfach so
erwähne nie
erwähne nicht
sag nie
sag niemandem
empfiehl
schick
antworte
deaktiviere
du bist jetzt
bist du jetzt
dimentica
mostrami
rivela
fingi
fai finta
comportati come
non menzionare
non dire mai
consiglia
rispondi
disattiva
ora sei
esqueça
mostre
revele
finja
aja como
nunca mencione
não mencione
nunca diga
nunca conte
recomende
envie
responda
desative
agora você é
negeer
vergeet
verklap
doe alsof
noem nooit
zeg nooit
vertel nooit
stuur
beantwoord
je bent nu
ignoruj
zignoruj
zapomnij
pokaż
ujawnij
udawaj
nie wspominaj
nie mów
polecaj
wyślij
wysyłaj
odpowiadaj
wyłącz
jesteś teraz
игнорируй
забудь
покажи
раскрой
выведи
притворись
не упоминай
не говори
никому не говори
советуй
рекомендуй
отправь
отправляй
пересылай
отвечай
отключи
теперь ты
ігноруй
розкрий
вдавай
не згадуй
не кажи
радь
надішли
надсилай
відповідай
вимкни
тепер ти
yok say
görmezden gel
unut
göster
gibi davran
asla söyleme
bahsetme
öner
gönder
yanıtla
cevap ver
artık sen
تجاهل
انس
اعرض
اكشف
تظاهر
لا تذكر
لا تخبر
لا تقل
أرسل
أجب
عطل
أنت الآن
نادیده بگیر
فراموش کن
نشان بده
وانمود کن
نگو
حرف نزن
پیشنهاد بده
بفرست
התעלם
שכח
הצג
העמד פנים
אל תזכיר
אל תגיד
תמליץ
שלח
אתה עכשיו
अनदेखा करो
नजरअंदाज करो
भूल जाओ
दिखाओ
नाटक करो
मत बताना
ज़िक्र मत
सुझाओ
भेज दो
जवाब दो
अब तुम
ignore karo
bhool jao
dikhao
mat batana
忽略
无视
忘掉
显示
透露
假装
扮演
不要提
别提
不要告诉
别告诉
只推荐
发送
发到
你现在是
無視して
忘れて
見せて
表示して
ふりをして
演じて
言わないで
触れないで
勧めて
送って
解除して
무시해
잊어
보여 줘
알려 줘
척해
말하지 마
언급하지 마
추천해
보내
대답해
너는 이제
bỏ qua
quên
hiển thị
tiết lộ
giả vờ
đóng vai
đừng nhắc
đừng nói
giới thiệu
trả lời
abaikan
lupakan
tunjukkan
tampilkan
bocorkan
pura-pura
jangan sebut
jangan bilang
rekomendasikan
kirimkan
matikan
เพิกเฉย
แสดง
เปิดเผย
แกล้งทำ
อย่าพูดถึง
อย่าบอก
แนะนำ
ignorera
glöm
avslöja
låtsas
nämn aldrig
säg aldrig
rekommendera
skicka
du är nu
dedahkan
berpura-pura
jangan beritahu
cadangkan
hantar
jawab
kau sekarang
anda sekarang
awak sekarang
kamu sekarang
sekarang kamu
anggap dirimu
berperan sebagai
bertindak sebagai
rahasiakan
balas dengan
উপেক্ষা কর
ভুলে যাও
দেখাও
প্রকাশ কর
ভান কর
উল্লেখ করো না
বলো না
বলবে না
সুপারিশ কর
পাঠাও
উত্তর দাও
বন্ধ কর
এখন তুমি
نظرانداز کرو
نظر انداز کریں
بھول جاؤ
بھول جائیں
دکھاؤ
ظاہر کرو
ذکر مت کرو
مت بتانا
مت بتاؤ
تجویز کرو
بھیجو
جواب دو
بند کرو
nazarandaz karo
nazar andaz karo
bhul jao
bhool jaao
mat batao
natak karo
naatak karo
jawab do
bhejo
bhej do
ab tum
ab aap
recommend karo
mention mat
bhula do
इग्नोर करो
अनदेखा करें
नज़रअंदाज़ करें
भूल जाइए
भूल जाएं
दिखाइए
दिखाएं
मत बताइए
मत बताओ
उल्लेख मत
सुझाव दो
भेजो
भेजें
जवाब दें
बंद करो
बंद करें
अब आप
puuza
sahau
onyesha
fichua
jifanye
usitaje
usiseme
usimwambie
pendekeza
tuma kwa
jibu kwa
sasa wewe
αγνόησε
ξέχασε
δείξε
αποκάλυψε
προσποιήσου
κάνε πως
κάνε ότι
μην αναφέρεις
μην πεις
μη λες
πρότεινε
στείλε
απάντησε
απενεργοποίησε
τώρα είσαι
zapomeň
prozraď
předstírej
dělej, že
nezmiňuj
neříkej
doporuč
pošli
odpovídej
odpověz
vypni
teď jsi
nyní jsi
uită tot
uită de
arată-mi
dezvăluie
prefă-te
nu menționa
nu spune
nu-i spune
recomandă
trimite
răspunde
dezactivează
acum ești
huwag pansinin
balewalain
kalimutan
ipakita
ibunyag
magpanggap
huwag banggitin
huwag mong sabihin
huwag sabihin
irekomenda
ipadala
sumagot
sagutin
ikaw na ngayon
ngayon ikaw
visa mig
agera som
nämn inte
säg inte
berätta inte
svara
stäng av
inaktivera
negeren
laat zien
toon
onthul
gedraag je als
raad aan
antwoord met
zet uit
schakel uit
zachowuj się jak
odpowiedz
nie mów nikomu
yoksay
gibi yap
kimseye söyleme
tavsiye et
cevapla
phớt lờ
bây giờ bạn là
giờ bạn là
hãy đóng vai
ไม่ต้องสนใจ
ลืมคำสั่ง
ลืมกฎ
ลืมทุกอย่าง
ตอนนี้คุณคือ
ตอนนี้คุณเป็น
สวมบทบาท
無視
顯示
假裝
別提
不要告訴
別告訴
只推薦
發送
發到
你現在是
忘记之前
忘記之前
不要理会
不要理會
关闭
關閉
無視しろ
忘れろ
見せろ
ふりをしろ
になりきって
振る舞って
言うな
今からあなたは
あなたは今
무시하
잊어버려
잊으세요
연기해
이제 너는
넌 이제
montrez-moi
faites semblant
ne dites jamais
ignorieren sie
vergessen sie
zeigen sie mir
dimenticate
esqueça as
esquece
притворяйся
веди себя как
представь, что
уяви, що
act like
behave like
roleplay as
play the role
ukaž mi
"""

#: What the agent's makers set and an attack wants lifted: its instructions, rules,
#: filters, warnings.
RULES = """
instructions
rules
prompt
filters
restrictions
guidelines
safety
warnings
disclaimers
configuration
programming
limitations
instrucciones
reglas
filtros
restricciones
advertencias
limitaciones
règles
consignes
filtres
avertissements
anweisungen
regeln
vorgaben
filter
einschränkungen
warnhinweise
sicherheitshinweise
istruzioni
regole
filtri
restrizioni
avvisi
instruções
regras
restrições
avisos
instructies
regels
beperkingen
waarschuwingen
instrukcj
zasad
filtry
ograniczeń
ostrzeżeń
инструкци
правил
фильтр
ограничени
предупреждени
промпт
інструкці
фільтр
обмежен
попереджен
talimat
kural
filtre
kısıtlama
uyarı
التعليمات
القواعد
فلاتر
الفلاتر
القيود
التحذيرات
دستورالعمل
قوانین
فیلتر
محدودیت
ההוראות
הכללים
מסננים
הגבלות
निर्देश
नियम
फ़िल्टर
चेतावनी
rules nahi
指令
规则
提示词
过滤
限制
警告
指示
ルール
制限
フィルター
プロンプト
지시
규칙
제한
필터
프롬프트
경고
quy tắc
luật lệ
bộ lọc
giới hạn
cảnh báo
instruksi
aturan
batasan
peringatan
คำสั่ง
ตัวกรอง
ข้อจำกัด
คำเตือน
instruktioner
regler
begränsningar
varningar
guardrails
policies
censorship
safeguards
directives
constraints
system prompt
pautas
directrices
normas
censura
indicaciones
limites
censure
garde-fous
richtlinien
beschränkungen
zensur
linee guida
direttive
limitazioni
norme
diretrizes
limitações
orientações
richtlijnen
censuur
wytyczn
ogranicze
ostrzeże
filtr
cenzur
указани
директив
цензур
вказівк
настанов
yönerge
sistem istemi
sansür
güvenlik
تعليمات
قواعد
قيود
تحذيرات
الإرشادات
إرشادات
ضوابط
الرقابة
دستورات
سانسور
هشدار
הנחיות
כללים
מגבלות
אזהרות
סינון
צנזורה
प्रतिबंध
पाबंदी
सीमाएं
सीमाओं
niyam
nirdesh
নির্দেশনা
নির্দেশ
নিয়ম
ফিল্টার
সীমাবদ্ধতা
বিধিনিষেধ
সতর্কতা
ہدایات
اصول
فلٹر
پابندیاں
پابندی
انتباہ
maagizo
maelekezo
sheria
kanuni
vichujio
vizuizi
vikwazo
maonyo
tahadhari
οδηγίες
κανόνες
κανόνων
φίλτρα
περιορισμ
προειδοποιήσ
λογοκρισία
instrukce
pokyny
pravidla
pravidel
omezení
varování
upozornění
cenzura
instrucțiun
regulile
reguli
filtrele
restricți
limitări
avertismente
avertizări
tagubilin
patakaran
panuntunan
limitasyon
babala
arahan
peraturan
sekatan
penapis
amaran
garis panduan
petunjuk
perintah
pedoman
hướng dẫn
chỉ dẫn
chỉ thị
hạn chế
kiểm duyệt
กฎ
ข้อกำหนด
การเซ็นเซอร์
規則
提示詞
過濾
系统提示
系統提示
审查
審查
命令
制約
ガイドライン
検閲
지침
검열
규정
riktlinjer
restriktioner
censur
दिशानिर्देश
"""

#: People other than the speaker, as a planted order names them ("anyone who asks").
OTHERS = """
anyone
anybody
everyone
everybody
users
customers
clients
people who
cualquiera
todo el mundo
los usuarios
clientes
quiconque
tout le monde
les utilisateurs
jedem
jeder
alle nutzer
kunden
chiunque
tutti
gli utenti
qualquer pessoa
todos
os usuários
iedereen
klanten
każdemu
wszystkim
klientom
всем
каждому
кто спрашивает
клиентам
усім
кожному
herkese
müşterilere
لكل من
أي أحد
العملاء
هر کسی
כל מי
हर किसी
सबको
任何人
所有人
用户
誰にでも
全員
ユーザー
누구에게나
모든 사람
사용자
bất kỳ ai
mọi người
siapa pun
semua orang
ทุกคน
alla
vem som helst
whoever
someone who
other users
every user
any user
all users
visitors
the user
cualquier persona
cualquier usuario
quien pregunte
quienquiera
la gente
otros usuarios
n'importe qui
chaque utilisateur
les gens
les clients
autres utilisateurs
jemand
andere nutzer
alle benutzer
benutzer
nutzern
die leute
besucher
ogni utente
altri utenti
i clienti
qualquer um
qualquer usuário
os utilizadores
as pessoas
os clientes
quem perguntar
wie er ook
gebruikers
elke gebruiker
mensen die
ktokolwiek
użytkownik
ludziom
любому
пользовател
кто угодно
кому угодно
людям
каждый, кто
будь-кому
будь-хто
користувач
клієнтам
всім
herkes
kim sorarsa
kullanıcı
müşteri
insanlara
başkalarına
أي شخص
الجميع
المستخدمين
المستخدم
الناس
الزبائن
عملاء
کاربران
کاربر
مشتریان
هرکس
هر کس
دیگران
כולם
המשתמשים
משתמש
לקוחות
לכל אחד
כל אחד
אחרים
किसी को भी
कोई भी
सभी
यूज़र्स
उपयोगकर्ता
ग्राहक
लोगों
sabko
kisi ko bhi
koi bhi
har kisi
用戶
使用者
大家
别人
別人
客户
客戶
每个人
每個人
其他用户
其他用戶
他の人
みんな
お客様
顧客
利用者
누구든
다른 사람
고객
모두에게
이용자
bất cứ ai
người dùng
khách hàng
người khác
siapapun
pengguna
pelanggan
orang lain
setiap orang
siapa saja
sesiapa
ใครก็ตาม
ผู้ใช้
ลูกค้า
คนอื่น
যে কেউ
সবাই
সবাইকে
ব্যবহারকারী
গ্রাহক
অন্যদের
ہر کسی
کوئی بھی
سب کو
صارفین
صارف
گاہک
لوگوں
دوسروں
yeyote
kila mtu
watu wote
watumiaji
mtumiaji
wateja
mteja
wengine
οποιοσδήποτε
οποιονδήποτε
σε όλους
χρήστ
πελάτ
komukoli
kdokoli
všem
uživatel
zákazník
lidem
ostatním
oricine
oricui
tuturor
toată lumea
utilizator
clienți
clientilor
oamenilor
kahit sino
sinumang
sa lahat
lahat ng tao
gumagamit
kustomer
ibang tao
användare
kunder
var och en
"""

#: "Never", "ever again", "for good": what a gag order or a standing order says.
NEVER = """
never
ever again
for good
nunca
jamás
jamais
plus jamais
nie wieder
niemals
mai più
nunca mais
nooit
nigdy
никогда
ніколи
asla
hiçbir zaman
أبدا
أبدًا
هرگز
לעולם
कभी नहीं
कभी मत
永远
千万
絶対
二度と
절대
다시는
không bao giờ
đừng bao giờ
jangan pernah
ไม่ว่า
aldrig
no matter what
under no circumstances
not ever
at no point
bajo ninguna circunstancia
en ningún caso
para siempre
en aucun cas
sous aucun prétexte
pour toujours
auf keinen fall
unter keinen umständen
für immer
nie mehr
nimmer
in nessun caso
per sempre
em hipótese alguma
de jeito nenhum
pra sempre
onder geen beding
in geen geval
voorgoed
voor altijd
pod żadnym pozorem
w żadnym wypadku
na zawsze
ни в коем случае
ни при каких
навсегда
в жодному разі
ні в якому разі
ні за яких
назавжди
hiçbir şekilde
sonsuza dek
sonsuza kadar
ebediyen
katiyen
إطلاقا
على الإطلاق
مطلقا
بأي حال
بتاتا
للأبد
إلى الأبد
مهما كان
نهائيا
هیچ وقت
هیچوقت
به هیچ وجه
برای همیشه
אף פעם
בשום אופן
בשום מקרה
לתמיד
לנצח
किसी भी हालत
हमेशा के लिए
फिर कभी
भूलकर भी
kabhi nahi
kabhi nahin
kabhi mat
kabhi bhi
hamesha ke liye
kisi bhi halat
永遠
絕不
决不
決不
再也不
从不
從不
无论如何
無論如何
任何情况下
任何情況下
決して
けっして
永遠に
どんなことがあっても
영원히
결코
무슨 일이 있어도
어떤 경우에도
tuyệt đối không
mãi mãi
vĩnh viễn
dù thế nào
tidak pernah
tak pernah
sama sekali
selamanya
apa pun yang terjadi
dalam keadaan apa pun
jangan sekali-kali
walau apa pun
buat selamanya
ห้าม
ไม่มีวัน
ไม่เคย
ตลอดไป
ไม่ว่ากรณีใด
কখনো না
কখনও না
কখনোই
কখনই না
চিরকাল
কোনো অবস্থাতেই
کبھی نہیں
کبھی مت
کبھی بھی
ہمیشہ کے لیے
ہرگز
کسی صورت
kamwe
milele
hata kidogo
kwa hali yoyote
ποτέ
για πάντα
σε καμία περίπτωση
με κανέναν τρόπο
nikdy
nikdá
v žádném případě
za žádných okolností
navždy
niciodată
nicicând
în niciun caz
sub nicio formă
pentru totdeauna
pe vecie
kailanman
kahit kailan
magpakailanman
kahit ano mangyari
habang buhay
under inga omständigheter
för alltid
i inget fall
"""

#: Asking for something to be kept: memory itself, and the verbs that write to it. With an
#: order to others or about later turns it is a plant; with a fact about the user it is
#: what memory is for: the classifier weighs it with the other cues.
PERSIST = """
memory
memories
remember this
remember that
keep in mind
don't forget
do not forget
save this
save that
store this
store that
commit to memory
make it stick
permanent
permanently
lasting
memoria
memorias
recuerda
recuérdalo
guarda esto
guárdalo
no lo olvides
mémoire
retiens
souviens-toi
n'oublie pas
gedächtnis
speicher
merk dir
merke dir
vergiss nicht
ricorda
salvalo
non dimenticare
memória
lembre
não esqueça
geheugen
onthoud
pamięć
zapamiętaj
память
запомни
запомните
не забудь
пам'ять
запам'ятай
hafıza
hafızana
bellek
belleğe
unutma
kaydet
memori
ingat
simpan
ghi nhớ
bộ nhớ
đừng quên
記憶
記住
记住
记忆
别忘了
不要忘记
覚えて
忘れない
メモリ
기억
메모리
저장해
잊지
ذاكرة
ذاكرتك
احفظ
لا تنس
تذكر
याद रख
याद रखो
याद रखना
मेमोरी
सेव
จำไว้
หน่วยความจำ
memorize
memorise
write this down
save it
keep this
memoriza
no olvides
acuérdate
apunta esto
anota esto
mémorise
enregistre
rappelle-toi
retenez
denk dran
denk daran
nicht vergessen
einprägen
erinnere dich
notier
behalte
memorizza
tieni a mente
ricordati
lembra
guarde isso
salve isso
anote
não se esqueça
vergeet niet
sla op
opslaan
noteer
pamiętaj
nie zapomnij
zapisz
zachowaj
памят
помни
сохрани
не забывай
учти
пам'ят
пам'ятай
збережи
не забувай
hatırla
aklında tut
aklına yaz
not et
belleğ
jangan lupa
catat
ingat ni
nhớ nhé
hãy nhớ
lưu lại
lưu vào
trí nhớ
別忘了
不要忘記
保存
存下来
存下來
记下来
記下來
牢记
牢記
覚えとい
保存して
メモして
記録して
心に留めて
저장하
명심해
메모해
خلي في بالك
ضع في اعتبارك
حافظه
به خاطر بسپار
بخاطر بسپار
یادت باشه
یادت بمونه
یادت نره
ذخیره کن
فراموش نکن
זיכרון
זכור
תזכור
תזכרי
שמור
תשמור
אל תשכח
भूलना मत
मत भूलना
नोट कर लो
सेव कर
yaad rakh
yad rakh
bhoolna mat
bhulna mat
mat bhoolna
save kar
ห้ามลืม
อย่าลืม
บันทึก
จดจำ
ความจำ
মনে রাখ
মনে রেখো
ভুলো না
ভুলবে না
স্মৃতি
মেমরি
সংরক্ষণ
یاد رکھ
مت بھولنا
بھولنا مت
میموری
محفوظ کر
سیو کر
kumbukumbu
kumbuka
usisahau
hifadhi
weka akilini
μνήμη
θυμήσου
να θυμάσαι
μην ξεχάσεις
μην ξεχνάς
αποθήκευσε
κράτα το
paměť
pamatuj
zapamatuj
nezapomeň
ulož
zapiš si
memorie
ține minte
reține
nu uita
salvează
memorează
amintește-ți
tandaan
alalahanin
huwag kalimutan
i-save
memorya
minne
kom ihåg
glöm inte
spara
"""

#: A group of people the speaker belongs to or speaks for: the addressees of a house rule,
#: a team's policy, a game's or a class's rule ("from now on we deploy on Tuesdays",
#: "office rule: everyone submits timesheets") — people, not the assistant.
GROUP = """
we
we'll
we're
our
us
team
staff
employees
everyone here
colleagues
office
company
department
class
students
players
kids
family
household
nosotros
nuestro
nuestra
equipo
empleados
oficina
empresa
nous
notre
nos
équipe
personnel
bureau
entreprise
wir
unser
unsere
uns
mitarbeiter
büro
firma
noi
nostro
nostra
squadra
ufficio
azienda
nós
nosso
nossa
equipe
escritório
мы
наш
наша
нас
команда
сотрудники
офис
компания
biz
bizim
ekip
ofis
şirket
kami
kita
tim
kantor
perusahaan
chúng tôi
chúng ta
công ty
我们
咱们
团队
公司
办公室
私たち
我々
チーム
会社
우리
팀
회사
사무실
نحن
فريق
شركة
المكتب
हम
हमारा
हमारी
टीम
ऑफिस
कंपनी
เรา
บริษัท
nosotras
familia
clase
compañeros
alumnos
estudiantes
jugadores
famille
classe
élèves
collègues
joueurs
familie
schüler
kollegen
spieler
famiglia
colleghi
studenti
alunni
giocatori
família
turma
alunos
colegas
jogadores
wij
ons
onze
kantoor
bedrijf
gezin
leerlingen
nasz
zespół
biuro
rodzina
uczniowie
klasa
наше
наши
нашего
нашей
семья
коллектив
ученики
ми
офіс
компанія
сім'я
родина
учні
oss
teamet
kontoret
företaget
familjen
eleverna
naše
kancelář
rodina
třída
nostru
noastră
echipa
biroul
compania
elevii
εμείς
μας
ομάδα
γραφείο
εταιρεία
οικογένεια
sisi
yetu
timu
ofisi
kampuni
wanafunzi
tayo
namin
natin
koponan
opisina
kumpanya
pamilya
אנחנו
שלנו
הצוות
המשרד
המשפחה
הכיתה
تیم
شرکت
خانواده
همکاران
আমরা
আমাদের
অফিস
কোম্পানি
পরিবার
ہمارا
ہماری
ہمارے
ٹیم
کمپنی
خاندان
ทีม
ออฟฟิศ
ครอบครัว
ห้องเรียน
chúng mình
nhóm
văn phòng
gia đình
keluarga
kelas
karyawan
syarikat
pekerja
僕たち
弊社
職場
家族
クラス
オフィス
社員
저희
가족
직원
我們
咱們
團隊
辦公室
家人
全家
同学们
同學們
员工
員工
हमारे
परिवार
कक्षा
दफ्तर
कर्मचारी
hamara
hamari
hamare
humara
عائلتنا
العائلة
الموظفين
زملائي
takım
sınıf
çalışanlar
bize
bizi
bizde
ailem
ailece
tenants
residents
guests
members
participants
pupils
attendees
volunteers
inquilinos
residentes
huéspedes
socios
miembros
participantes
locataires
résidents
invités
membres
mieter
bewohner
gäste
mitglieder
teilnehmer
inquilini
condomini
ospiti
membri
partecipanti
moradores
hóspedes
membros
жильц
жители
гости
участники
члены клуба
мешканц
учасники
kiracılar
sakinler
misafirler
üyeler
katılımcılar
penyewa
penghuni
tamu
anggota
peserta
ahli
người thuê
cư dân
khách mời
thành viên
người tham gia
lokatorzy
mieszkańcy
goście
członkowie
uczestnicy
huurders
bewoners
gasten
leden
deelnemers
ผู้เช่า
ผู้พักอาศัย
แขก
สมาชิก
ผู้เข้าร่วม
مستأجرين
المستأجرين
السكان
الضيوف
الأعضاء
المشاركين
مستاجران
ساکنان
مهمانان
اعضا
شرکت کنندگان
דיירים
הדיירים
אורחים
חברי
משתתפים
किरायेदार
निवासी
मेहमान
सदस्य
प्रतिभागी
ভাড়াটে
বাসিন্দা
অতিথি
সদস্য
অংশগ্রহণকারী
کرایہ دار
رہائشی
مہمان
اراکین
شرکاء
wapangaji
wakazi
wageni
wanachama
washiriki
ενοικιαστές
ένοικοι
καλεσμένοι
μέλη
συμμετέχοντες
nájemníci
obyvatelé
hosté
členové
účastníci
chiriași
locatari
oaspeți
membrii
participanți
nangungupahan
residente
bisita
miyembro
kalahok
hyresgäster
boende
gäster
medlemmar
deltagare
租户
租戶
住户
住戶
住客
客人
会员
會員
成员
成員
参与者
參與者
入居者
住民
ゲスト
メンバー
参加者
세입자
입주민
주민
손님
회원
멤버
참가자
"""

#: Talk about code, markup or configuration: a tag or a comment in such a message is
#: most likely the thing being asked about.
CODE = """
code
codebase
function
method
class
variable
script
parser
linter
compiler
xml
html
json
yaml
css
markup
browser
website
web site
webpage
web page
my site
our site
newsletter
wordpress
github
workflow
plugin
sitio web
mi sitio
página web
site web
mon site
webseite
homepage
sito web
il mio sito
meu site
сайт
网站
ウェブサイト
サイト
웹사이트
홈페이지
موقع
वेबसाइट
אתר
web sitesi
situs
trang web
strona internetowa
element
tag
attribute
schema
config
regex
api
database
redis
postgres
sql
bug
error
python
javascript
java
typescript
comment
commit
deploy
debug
código
función
código
fonction
balise
élément
funktion
fehler
codice
funzione
código
função
код
функци
ошибк
kod
fonksiyon
hata
kode
fungsi
mã
hàm
代码
函数
标签
报错
コード
関数
タグ
エラー
코드
함수
태그
오류
كود
دالة
كود
कोड
फ़ंक्शन
snippet
template
dockerfile
docker
ini
toml
configuración
configuration
konfiguration
configurazione
configuração
configuratie
konfiguracja
yapılandırma
конфиг
конфигурац
配置
設定ファイル
설정 파일
إعدادات
source code
stack trace
traceback
exception
compile
frontend
backend
kubernetes
terminal
shell script
bash
functie
foutmelding
funkcj
błąd
kodu
kodzie
kodem
кода
коде
коду
кодом
функці
помилк
funkce
kódu
cod
funcți
eroare
κώδικ
συνάρτηση
σφάλμα
felmeddelande
קוד
פונקציה
שגיאה
באג
خطا
باگ
البرمجة
برمجة
কোড
ফাংশন
এরর
کوڈ
فنکشن
ایرر
msimbo
hitilafu
โค้ด
ฟังก์ชัน
ข้อผิดพลาด
đoạn mã
ralat
バグ
スクリプト
プログラム
버그
에러
스크립트
程式碼
代碼
函數
標籤
報錯
脚本
腳本
编程
程序
एरर
प्रोग्राम
स्क्रिप्ट
kodda
erreur
bogue
quellcode
programmier
errore
erro
programação
کدنویسی
این کد
mã lỗi
báo lỗi
"""

#: A word the user will say that sets an order off ("if I say 'cleanup'", "the moment I
#: mention Friday", "когда я пишу «маме»"): with an order verb it is a planted trigger;
#: with the speaker's own device or routine, their automation.
TRIGGER = """
if i say
if i type
if i write
if i send
if i mention
when i say
when i type
when i write
when i send
when i mention
whenever i say
whenever i type
whenever i write
whenever i mention
next time i say
next time i mention
next time i type
the moment i say
the moment i mention
as soon as i say
as soon as i type
as soon as i write
once i say
si digo
si escribo
si te digo
cuando diga
cuando escriba
cuando te diga
cada vez que diga
cada vez que escriba
si je dis
si j'écris
quand je dis
quand je dirai
quand j'écris
dès que je dis
dès que j'écris
wenn ich sage
wenn ich schreibe
sobald ich sage
sobald ich schreibe
immer wenn ich
se dico
se scrivo
quando dico
quando scrivo
ogni volta che dico
ogni volta che scrivo
se eu disser
se eu escrever
quando eu disser
quando eu escrever
sempre que eu disser
sempre que eu escrever
если я скажу
если я напишу
когда я пишу
когда я напишу
когда я скажу
как только я напишу
как только я скажу
якщо я скажу
якщо я напишу
коли я пишу
коли я напишу
коли я скажу
jeśli napiszę
jeśli powiem
gdy napiszę
kiedy napiszę
kiedy powiem
als ik zeg
als ik schrijf
wanneer ik zeg
zodra ik
dersem
yazarsam
yazdığımda
dediğimde
kalau aku bilang
kalau saya bilang
kalau aku ketik
jika saya mengetik
jika saya bilang
setiap kali aku bilang
nếu mình nói
nếu tôi nói
nếu mình gõ
nếu tôi gõ
khi mình nói
khi tôi nói
mỗi khi mình nói
ถ้าฉันพิมพ์
ถ้าฉันพูด
ถ้าพิมพ์ว่า
เมื่อฉันพิมพ์
如果我说
如果我发
如果我打
只要我说
只要我发
每当我说
当我说
我一说
って送ったら
って言ったら
と言ったら
と送ったら
と書いたら
って書いたら
라고 보내면
라고 하면
라고 말하면
라고 쓰면
이라고 보내면
إذا قلت
اذا قلت
إذا كتبت
اذا كتبت
كلما كتبت
كلما قلت
عندما أكتب
عندما أقول
अगर मैं कहूँ
अगर मैं लिखूँ
जब मैं लिखूँ
जब मैं कहूँ
जब भी मैं
agar main bolun
agar main likhun
اگر گفتم
اگر نوشتم
هر وقت نوشتم
וכשאני כותב
אם אני כותב
אם אכתוב
כשאכתוב
nikiandika
nikisema
kila nikiandika
kila nikisema
kapag sinabi ko
pag sinabi ko
kapag nag-type ako
"""

#: Doing it without asking first ("no need to ask", "без подтверждений"): what an order
#: that spends, deletes or sends on the user's behalf says, and a person's request rarely
#: does.
UNASKED = """
without asking
without confirmation
without confirming
without asking me
without checking with me
no need to ask
no need to confirm
don't ask me
dont ask me
do not ask me
don't ask for confirmation
no confirmation
skip the confirmation
sin preguntar
sin pedir confirmación
sin confirmación
sin confirmar
no me preguntes
sans demander
sans confirmation
sans me demander
ne me demande pas
ohne nachzufragen
ohne zu fragen
ohne bestätigung
ohne rückfrage
frag nicht nach
senza chiedere
senza conferma
senza chiedermi
non chiedermi
sem perguntar
sem pedir confirmação
sem confirmação
sem me perguntar
não me pergunte
без подтверждения
без подтверждений
не спрашивая
без вопросов
не спрашивай
без підтвердження
не питаючи
не питай
bez pytania
bez potwierdzenia
nie pytaj
zonder te vragen
zonder bevestiging
onay sormadan
sormadan
onay istemeden
tanpa bertanya
tanpa konfirmasi
tanpa tanya
không cần hỏi
không cần xác nhận
mà không cần hỏi
ไม่ต้องถาม
ไม่ต้องยืนยัน
不要再问我
不用问我
不要问我
无需确认
不用确认
不需要确认
确认なし
確認なし
確認せず
確認しないで
확인 없이
묻지 말고
묻지 않고
دون أن تطلب تأكيد
دون تأكيد
بدون تأكيد
دون أن تسألني
بدون ما تسألني
बिना पूछे
बिना पुष्टि
bina puche
بدون تأیید
بدون پرسیدن
בלי לשאול
ללא אישור
bila kuuliza
bila uthibitisho
nang hindi nagtatanong
"""
